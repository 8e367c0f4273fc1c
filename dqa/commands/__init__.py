"""One module per CLI command. Each exposes ``register(app)``; keep top-level imports light
(typer only) so ``dqa --help`` stays fast: heavy libraries load inside the command body."""
