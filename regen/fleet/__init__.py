"""The fleet: what `dqa fleet up` launches (``spec``), how (``launch``, ``stage``, ``up``), the fleet file
every fleet command reads (``file``), what a running fleet is doing (``status``) and its logs (``logs``).
"""
