"""``dqa regen``: regenerate the failing samples on a fleet of servers, exactly once, resumable."""

from __future__ import annotations

from typing import List, Optional

import typer

from dqa.commands.common import handles_errors, storage_option_param
from dqa.regen.config import DatasetSpec, DispatchSpec, OutputSpec, Retries, SamplingSpec, Selection, Timeouts
from dqa.reports.trackers import REPORT_TO_HELP

HELP = """Regenerate the samples `dqa scan` flagged, with thinking on, on a fleet of SGLang (or OpenAI-compatible) servers.

The prompt is each sample's own input_ids up to its last assistant header (a prefilled empty think block is dropped, so the model thinks); the new sample is prompt + the server's output tokens, loss_mask 0 over the prompt and 1 over the output. Results go to parquet shards in --out (see FORMATS.md); progress.json there is rewritten every ~2 s.

Resumable: rerun the same command after a crash, kill -9 or Ctrl-C; finished rows are never sent or written again. The first Ctrl-C (or SIGTERM) stops dispatching and drains in-flight requests; a second one cancels them.

Example:  dqa regen data/train.parquet --fleet fleet.json --out regen/ --gpu-hour-cost 6.5

Every request goes over aiohttp: --request-timeout bounds each attempt's whole reply, a reply bigger than its request can honestly produce fails (its size is bounded by --max-new-tokens), and replies that break HTTP's framing rules are refused; each such attempt is retried, never recorded ok.

Exit codes: 0 every selected row recorded (ok, length or failed), 2 bad input, an --out made for another run, an endpoint that does not speak --protocol or whose generation route redirects, or an https:// endpoint whose certificate cannot be verified (pass --ca-bundle), 3 interrupted, no endpoint answering at start-up, all endpoints down past --down-deadline, a request every server rejects (a dqa bug), or every request of the run failed.
"""


def register(app: typer.Typer) -> None:
    app.command("regen", help=HELP, no_args_is_help=True)(regen)


@handles_errors
def regen(
    dataset: str = typer.Argument(..., help="Tokenized dataset: parquet file/folder, HF save_to_disk folder, Arrow or JSONL; a path or a URL (s3://...)."),
    ids_column: Optional[str] = typer.Option(None, help="Token ids column (default: input_ids)."),
    mask_column: Optional[str] = typer.Option(None, help="0/1 loss mask column (default: loss_mask, if present)."),
    labels_column: Optional[str] = typer.Option(None, help="Labels column, -100 = unsupervised (default: labels)."),
    id_column: Optional[str] = typer.Option(None, help="Sample id column (default: id, if present)."),
    failed_only: bool = typer.Option(Selection.failed_only, "--failed-only/--all", help="Only the rows in findings.parquet (default), or every row."),
    findings: Optional[str] = typer.Option(None, "--findings", help="findings.parquet or the folder holding it, or their URL. Default: dqa-out/<dataset name>/ (where `dqa scan` writes)."),
    reasons: Optional[str] = typer.Option(None, "--reasons", help="Only rows flagged by these checks, comma-separated, e.g. degenerate_template,empty_thinking."),
    turns: str = typer.Option(Selection.turns, "--turns", help="Which assistant turns of a conversation to regenerate, each in order on the regenerated history: flagged (default: from the first turn the scan flags to the last; the last turn when only whole-sample checks flag it), all, or last."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N selected rows (a trial run; a later run with a larger limit resumes it)."),
    endpoint: List[str] = typer.Option([], "--endpoint", "-e", help="Server base URL, repeatable: -e http://10.0.0.5:30000 -e http://10.0.0.6:30000."),
    fleet: List[str] = typer.Option([], "--fleet", help="Fleet file written by `dqa fleet up` (endpoints, protocol, model); repeatable, one per node: the servers are their union."),
    out: str = typer.Option(..., "--out", "-o", help="Output folder, or an fsspec URL (s3://bucket/run/): staged locally, closed shards uploaded."),
    protocol: Optional[str] = typer.Option(None, "--protocol", help="sglang (native /generate, token-exact; default) or openai (/v1/chat/completions, text round trip)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name to send (openai) and record. Default: the fleet file's, else asked from the server."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="Environment variable holding the API key (sent as a bearer token, never logged or written)."),
    max_in_flight: int = typer.Option(DispatchSpec.max_in_flight, "--max-in-flight", help="Requests in flight per endpoint (match the server's --max-running-requests)."),
    temperature: float = typer.Option(SamplingSpec.temperature, "--temperature", help="Sampling temperature (Qwen3 thinking: 0.6)."),
    top_p: float = typer.Option(SamplingSpec.top_p, "--top-p", help="Nucleus sampling (Qwen3 thinking: 0.95)."),
    top_k: int = typer.Option(SamplingSpec.top_k, "--top-k", help="Top-k sampling (Qwen3 thinking: 20)."),
    max_new_tokens: int = typer.Option(SamplingSpec.max_new_tokens, "--max-new-tokens", help="Output token limit; rows that hit it are recorded with status 'length'. Prompt + this must fit the servers' context length."),
    shard: Optional[str] = typer.Option(None, "--shard", help="i/N: this driver takes the selected rows with row % N == i (one --out per driver)."),
    gpu_hour_cost: float = typer.Option(DispatchSpec.gpu_hour_cost, "--gpu-hour-cost", help="Price of one GPU-hour, for cost so far and projected."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs the fleet uses, for cost. Default: from the fleet file, else one per endpoint."),
    mirror: List[str] = typer.Option([], "--mirror", help="Also copy each closed shard to this fsspec URL (repeatable)."),
    tokenizer: str = typer.Option(DatasetSpec.tokenizer, "--tokenizer", "-t", help="Tokenizer folder (tokenizer.json + chat template) or the preset qwen3: gives the assistant header ids; openai also renders replies with it."),
    retry_failed: bool = typer.Option(Selection.retry_failed, "--retry-failed", help="On resume, send the rows recorded as failed again (their old records are replaced)."),
    max_attempts: int = typer.Option(Retries.max_attempts, "--max-attempts", help="Attempts per row before it is recorded as failed."),
    request_timeout: float = typer.Option(Timeouts.request, "--request-timeout", help=f"Seconds one attempt may take from its connection to the reply's last byte, however the server paces it; then it is retried (long: a disconnect aborts the request on the server). Connecting has its own {Timeouts.connect:g} s."),
    context_length: Optional[int] = typer.Option(None, "--context-length", help="The servers' context length (tokens), for an SGLang router whose workers dqa cannot ask (it refuses to start without it); the smaller one wins when the servers say theirs. Prompts that cannot fit are recorded failed, never sent."),
    ca_bundle: Optional[str] = typer.Option(None, "--ca-bundle", help="CA certificates (PEM) that verify https:// servers (default: $SSL_CERT_FILE, $REQUESTS_CA_BUNDLE, else the system's). Proxies: HTTP_PROXY / HTTPS_PROXY, and NO_PROXY for hosts to reach directly."),
    down_deadline: float = typer.Option(Timeouts.down_deadline, "--down-deadline", help="Stop (exit 3, resumable) when no endpoint has been healthy for this many seconds (endpoints that never answer at all stop the run at start-up, within seconds)."),
    shard_rows: int = typer.Option(OutputSpec.shard_rows, "--shard-rows", help=f"Rows per output shard (a shard also closes every {OutputSpec.shard_seconds / 60:g} minutes)."),
    json_out: bool = typer.Option(False, "--json", help="Print the final progress object as JSON on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live display, no log lines, no summary; exit code (and --json) only."),
    storage_option: List[str] = storage_option_param(),
    report_to: List[str] = typer.Option([], "--report-to", metavar="NAME", help=REPORT_TO_HELP),
) -> None:
    import json

    from dqa import api, storage

    storage.configure(storage_option)
    from dqa.errors import RegenStopped
    from dqa.regen.config import RegenConfig
    from dqa.reports import trackers as tracking
    from dqa.reports.trackers.feed import report_regen, report_regen_live

    report_to = tracking.require(report_to)

    # Each group checks its own options (UsageError, exit 2) before anything is read.
    output = OutputSpec(out, mirror=tuple(mirror), shard_rows=shard_rows)
    dispatch = DispatchSpec(
        endpoints=tuple(endpoint), fleet=tuple(fleet) or None, protocol=protocol, model=model, api_key_env=api_key_env,
        max_in_flight=max_in_flight, gpus=gpus, gpu_hour_cost=gpu_hour_cost, ca_bundle=ca_bundle,
        context_length=context_length, timeouts=Timeouts(request=request_timeout, down_deadline=down_deadline), retries=Retries(max_attempts=max_attempts),
    )
    cfg = RegenConfig(
        data=DatasetSpec(dataset, ids_column=ids_column, mask_column=mask_column, labels_column=labels_column, id_column=id_column,
                         tokenizer=tokenizer),
        sampling=SamplingSpec(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens),
        selection=Selection(
            failed_only=failed_only, findings=findings, limit=limit, shard=shard, turns=turns, retry_failed=retry_failed,
            reasons=tuple(r.strip() for r in reasons.split(",") if r.strip()) if reasons else None,
        ),
        dispatch=dispatch,
        output=output,
        live=False if quiet else None,
        log=(lambda msg: None) if quiet else None,
    )
    # Live figures with each progress.json rewrite; the final ones once the run stops (also when interrupted).
    trackers = tracking.open_trackers(report_to, tracking.RunName.of("regen", dataset, out), quiet=quiet or json_out)
    if trackers:
        import dataclasses

        cfg = dataclasses.replace(cfg, on_progress=lambda snap: report_regen_live(trackers, snap))
    stopped = None
    try:
        result = api.regenerate(config=cfg)
    except RegenStopped as exc:  # the run's progress is still printed (--json), then its one-line error
        stopped, result = exc, exc.result
    except BaseException:
        trackers.close()
        raise
    try:
        if trackers and result is not None:
            report_regen(trackers, result.progress)
    finally:
        trackers.close()
    # The run's files are final: a late Ctrl-C/SIGTERM must not turn this exit into a signal death.
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if json_out:
        typer.echo(json.dumps(result.progress, indent=2))
    elif not quiet and stopped is None:
        typer.echo(_summary(result.progress, result.out))
    if stopped is not None:
        from dqa.commands.common import fail

        fail(str(stopped), stopped.exit_code)


def _summary(p: dict, out: str) -> str:
    """One result line for stdout: what the run recorded and where."""
    parts = [f"{p.get('done', 0):,} of {p.get('total', 0):,} rows recorded", f"{p.get('ok', 0):,} ok"]
    if p.get("truncated"):
        parts.append(f"{p['truncated']:,} truncated (status length)")
    if p.get("failed"):
        parts.append(f"{p['failed']:,} failed")
    if p.get("same_endpoint_share") is not None:  # a multi-turn run: where its next turns went
        parts.append(f"{p['same_endpoint_share']:.0%} of {p['consecutive_turns']:,} next turns on the same endpoint ({p.get('turns_moved', 0):,} moved)")
    cost = f", cost {p['cost_so_far']:.2f}" if p.get("gpu_hour_cost") else ""
    return f"dqa regen: {', '.join(parts)} -> {out} in {p.get('elapsed_s', 0):.1f}s{cost}"
