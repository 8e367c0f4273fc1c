"""Jobs: which rows are regenerated (``rows``: findings -> rows), their prompts (``prompts``) and the
jobs sent for them (``job``: ``Job``, ``Sampling``; ``turns``: one ``TurnJob`` per assistant turn).
"""
