"""Jobs: which rows are regenerated (``rows``: findings -> rows), their prompts (``prompts``) and the
jobs sent for them (``job``: ``Job``; ``turns``: one ``TurnJob`` per assistant turn).
"""
