"""Dispatch: the start-up preflight (``preflight``), the scheduler that runs the jobs through the fleet
(``scheduler``), the endpoints' health (``endpoints``) and the live figures of a run (``progress``).
"""
