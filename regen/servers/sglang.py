"""SGLang: the native token-exact ``/generate`` protocol, ``/health_generate``, the
``python -m sglang.launch_server`` command of `dqa fleet up` with its own options
(``SglangOptions``: MTP, the Mamba cache strategy, the release, deterministic inference) and the
Prometheus ``/metrics`` (or ``Decode batch`` log line) `dqa fleet status` reads. Facts per SGLang release (length check, the
Mamba cache strategy flag) are in ``servers.sglang_releases``; see docs/sglang.md.

Request: ``POST /generate`` with ``input_ids`` and ``sampling_params``; the reply's
``output_ids`` are kept as is (token-exact). Aborts follow SGLang (docs/sglang.md, "Aborts"): a plain
abort is an HTTP 200 whose ``finish_reason`` is ``{"type": "abort", "status_code": null}`` with
partial ``output_ids`` (retried; the partial output is not kept); an abort with a status code
arrives as a real HTTP 400/500/503 and is classified like any such status.

Status sources, best first: ``/metrics`` (``--enable-metrics``), parsed with
``prometheus_client``'s text parser; else the latest ``Decode batch`` line of the server's log
(regexes tolerant to format drift between versions).
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dqa.errors import UsageError
from dqa.regen.servers.replies import ENDPOINT_FAULT_STATUS, RETRY_STATUS, error_in_body
from dqa.regen.wire.outcome import FAIL, LENGTH, OK, RETRY, Outcome, count_or_none, short
from dqa.regen.config import DEFAULT_MAMBA_EXTRA_BUFFER, SamplingSpec
from dqa.regen.jobs.job import Job
from dqa.regen.wire.http_probe import http_get
from dqa.regen.servers.sglang_releases import MAMBA_STRATEGY_FLAGS, NEWEST_KNOWN, mamba_extra_buffer_flags, parse_version

from .base import EngineOptions, Protocol, ServerKind

# ------------------------------------------------------------------------------ request and reply


class SglangProtocol(Protocol):
    """Native SGLang ``/generate`` with ``input_ids`` (token-exact)."""

    name = "sglang"
    path = "/generate"

    def __init__(self, sampling: SamplingSpec, model: str | None = None):
        self.sampling = sampling
        self.model = model or ""
        sp = sampling.as_dict()
        sp.pop("max_new_tokens")
        self.sampling_keys = (*sp, "max_new_tokens", "sampling_seed")
        self._sp_head = json.dumps(sp)[:-1].encode()  # '{"temperature": ..., "top_k": 20' (no closing brace)

    def body(self, job: Job, attempt: int, extras_off: frozenset[str], max_new: int) -> bytes:
        if job.body_cache is None:
            # The prompt's JSON is built once per sample, not once per attempt.
            text = job.prompt_text if job.prompt_text is not None else ",".join(map(str, job.prompt.tolist())).encode()
            job.body_cache = b'{"input_ids":[' + text + b'],"sampling_params":' + self._sp_head
            job.prompt_text = None
            job.rid_prefix = json.dumps(job.key + ":").encode()[:-1]  # '"key:' (JSON-escaped, open quote)
        return job.body_cache + b',"max_new_tokens":%d,"sampling_seed":%d},"rid":%s%d"}' % (max_new, job.seed, job.rid_prefix, attempt)

    def parse(self, obj: Any, job: Job) -> Outcome:
        """Read ``output_ids`` and ``meta_info.finish_reason`` (dict shapes per docs/sglang.md)."""
        bad = error_in_body(obj)
        if bad is not None:
            return bad
        if isinstance(obj, list) and len(obj) == 1:
            obj = obj[0]
        if not isinstance(obj, dict):
            return Outcome(FAIL, error=f"reply is not a JSON object: {short(obj, 120)}")
        meta = obj.get("meta_info") or {}
        fr = meta.get("finish_reason")
        if isinstance(fr, dict):
            ftype = str(fr.get("type", ""))
        elif isinstance(fr, str):
            ftype = fr
        else:
            return Outcome(FAIL, error="reply has no meta_info.finish_reason")
        if ftype == "abort":
            msg = fr.get("message", "") if isinstance(fr, dict) else ""
            code = fr.get("status_code") if isinstance(fr, dict) else None
            if not isinstance(code, int) or isinstance(code, bool):
                # A plain abort (HTTP 200, no status code): not the row's fault; the partial
                # output is dropped and the row is asked again.
                partial = obj.get("output_ids")
                n = len(partial) if isinstance(partial, list) else 0
                return Outcome(RETRY, finish_reason="abort", error=f"aborted by the server (HTTP 200, no status code): {short(msg) or 'Aborted'}; {n} partial tokens dropped")
            err = f"aborted by the server ({code}): {short(msg)}"
            if 400 <= code < 500 and code not in RETRY_STATUS:
                return Outcome(FAIL, finish_reason="abort", error=err)
            return Outcome(RETRY, finish_reason="abort", error=err, endpoint_fault=code in ENDPOINT_FAULT_STATUS)
        out = obj.get("output_ids")
        if out is None:
            return Outcome(FAIL, finish_reason=ftype, error="reply has no output_ids (SGLang too old? it needs a version that returns output_ids)")
        try:
            ids = np.asarray(out, dtype=np.int32)
        except (TypeError, ValueError, OverflowError):
            return Outcome(FAIL, finish_reason=ftype, error="output_ids are not token ids")
        if ids.ndim != 1:
            return Outcome(FAIL, finish_reason=ftype, error="output_ids are not a flat list")
        kind = LENGTH if ftype == "length" else OK
        return Outcome(kind, output_ids=ids, finish_reason=ftype, cached_tokens=count_or_none(meta.get("cached_tokens")))


# ------------------------------------------------------------------------------ launch

# SGLang MTP: NEXTN (rewritten to EAGLE by SGLang), 3 steps, top-k 1, 4 draft tokens (docs/sglang.md).
MTP_FLAGS = [
    "--speculative-algorithm", "NEXTN",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
]  # fmt: skip
MAMBA_EXTRA_BUFFER_MODES = ("auto", "on", "off")  # --mamba-extra-buffer
DETERMINISTIC_FLAG = "--enable-deterministic-inference"  # per-row seeds reproduce outputs (slower sampling)
VERSION_QUERY = 'import importlib.metadata as m; print(m.version("sglang"))'


def is_hybrid_mamba(model: str) -> bool:
    """True when ``model``'s config.json describes a hybrid linear-attention/Mamba model
    (Qwen3-Next / Qwen3.5 style), which needs SGLang's extra_buffer strategy with MTP."""
    cfg_path = Path(model) / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    configs = [cfg] + [v for v in cfg.values() if isinstance(v, dict)]  # text_config of VL models
    for c in configs:
        model_type = str(c.get("model_type", "")).lower()
        if model_type.startswith(("qwen3_next", "qwen3_5", "qwen3_6")) or "mamba" in model_type or "jamba" in model_type:
            return True
        archs = " ".join(map(str, c.get("architectures") or [])).lower()
        if any(k in archs for k in ("next", "mamba", "jamba", "hybrid", "nemotronh")):
            return True
        layer_types = c.get("layer_types") or c.get("layers_block_type") or []
        if isinstance(layer_types, list) and any(
            isinstance(t, str) and ("linear" in t or "mamba" in t) for t in layer_types
        ):
            return True
        if "full_attention_interval" in c or "linear_num_value_heads" in c:
            return True
    return False


@dataclass(frozen=True)
class SglangOptions(EngineOptions):
    """The `dqa fleet up` options only SGLang servers have (``FleetSpec.engine_options``).

    ``mtp``: speculative decoding with the model's MTP heads (``MTP_FLAGS``);
    ``mamba_extra_buffer``: with ``mtp``, the ``extra_buffer`` Mamba cache strategy: ``auto`` (when
    the model is hybrid Mamba), ``on`` or ``off``; ``sglang_version``: the servers' release, for the
    flags that differ between releases (None: asked from the servers' Python where it matters, else
    ``NEWEST_KNOWN``); ``deterministic``: ``--enable-deterministic-inference`` (the per-row seeds
    then take effect); ``hybrid``: the model is hybrid Mamba (None: read from its config.json).
    """

    mtp: bool = False
    mamba_extra_buffer: str = DEFAULT_MAMBA_EXTRA_BUFFER
    sglang_version: str | None = None
    deterministic: bool = False
    hybrid: bool | None = None

    def check(self) -> None:
        """Raise ``UsageError`` for a Mamba mode other than auto/on/off, or an ``sglang_version``
        that is not a release number."""
        if self.mamba_extra_buffer not in MAMBA_EXTRA_BUFFER_MODES:
            raise UsageError(f"--mamba-extra-buffer {self.mamba_extra_buffer!r}: expected auto, on or off")
        if self.sglang_version is not None and parse_version(self.sglang_version) is None:
            raise UsageError(f"--sglang-version {self.sglang_version!r}: expected a release number such as 0.5.11")

    def refuse_for(self, engine: str) -> None:
        """``--mtp`` and ``--deterministic`` change what runs, so another engine refuses them; the
        release and the Mamba mode (which only applies with ``--mtp``) are dropped."""
        if self.mtp:
            raise UsageError(f"--mtp is an SGLang option; drop it with --engine {engine}")
        if self.deterministic:
            raise UsageError(f"--deterministic is an SGLang option; drop it with --engine {engine}")


def wants_extra_buffer(spec) -> bool:
    """Whether the servers of ``spec`` (a checked ``FleetSpec``) need the ``extra_buffer`` Mamba
    cache strategy: ``--mtp`` with ``--mamba-extra-buffer on``, or ``auto`` and a hybrid Mamba model."""
    opts = spec.engine_options
    if not isinstance(opts, SglangOptions) or not opts.mtp:
        return False
    return opts.mamba_extra_buffer == "on" or (
        opts.mamba_extra_buffer == "auto" and (opts.hybrid if opts.hybrid is not None else is_hybrid_mamba(spec.model))
    )


def installed_sglang_version(python: str, timeout: float = 60.0) -> str | None:
    """The sglang release installed for ``python`` (its package metadata; sglang itself is not
    imported, which would take seconds and need a GPU build); None when it cannot be asked (no
    such Python, no sglang there, no answer in ``timeout`` seconds)."""
    try:
        r = subprocess.run([python, "-c", VERSION_QUERY], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    text = r.stdout.strip()
    if r.returncode != 0 or parse_version(text) is None:
        return None
    return text.splitlines()[-1].strip()


def launch_argv(spec, port: int) -> list[str]:
    """The argument list of one SGLang server of ``spec`` (a checked ``FleetSpec``) listening on
    ``port`` (see docs/sglang.md, "Launch")."""
    opts = spec.engine_options
    argv = [spec.python, "-m", "sglang.launch_server", "--model-path", spec.model, "--host", spec.host, "--port", str(port)]
    if spec.context_length:
        argv += ["--context-length", str(spec.context_length)]
    if spec.max_running_requests:
        argv += ["--max-running-requests", str(spec.max_running_requests)]
    if spec.reasoning_parser:
        argv += ["--reasoning-parser", spec.reasoning_parser]
    if spec.metrics:
        argv += ["--enable-metrics"]
    if opts.deterministic:
        argv += [DETERMINISTIC_FLAG]
    if opts.mtp:
        argv += MTP_FLAGS
        given = any(a.split("=", 1)[0] in MAMBA_STRATEGY_FLAGS for a in spec.extra)
        if wants_extra_buffer(spec) and not given:
            argv += mamba_extra_buffer_flags(parse_version(opts.sglang_version))
    return argv + list(spec.extra)


# ------------------------------------------------------------------------------ fleet status

# Metric (name without the "sglang:" prefix) -> (status field, how label sets combine).
METRICS = {
    "gen_throughput": ("gen_tok_per_s", "sum"),
    "num_running_reqs": ("running", "sum"),
    "num_queue_reqs": ("queued", "sum"),
    "token_usage": ("kv_usage", "mean"),
    "spec_accept_length": ("accept_len", "mean"),
    "spec_accept_rate": ("accept_rate", "mean"),
    "num_requests_total": ("requests_total", "sum"),
    "num_aborted_requests_total": ("aborted_total", "sum"),
    "prompt_tokens_total": ("prompt_tokens_total", "sum"),
    "generation_tokens_total": ("generation_tokens_total", "sum"),
    "cached_tokens_total": ("cached_tokens_total", "sum"),
    "e2e_request_latency_seconds_sum": ("_e2e_sum", "sum"),
    "e2e_request_latency_seconds_count": ("_e2e_count", "sum"),
}

# Decode log line fields; each regex tolerates the wording drift seen across SGLang versions.
DECODE_LINE = re.compile(r"decode batch", re.IGNORECASE)
LOG_FIELDS = {
    "running": re.compile(r"#running[- _]reqs?\s*:\s*(\d+)", re.IGNORECASE),
    "tokens": re.compile(r"#(?:full[- ])?tokens?\s*:\s*(\d+)", re.IGNORECASE),
    "kv_usage": re.compile(r"(?<![a-z])(?:full )?token usage\s*:\s*([0-9.]+)", re.IGNORECASE),
    "accept_len": re.compile(r"accept(?:ance)?[ _]len(?:gth)?\s*:\s*([0-9.]+)", re.IGNORECASE),
    "accept_rate": re.compile(r"accept(?:ance)?[ _]rate\s*:\s*([0-9.]+)", re.IGNORECASE),
    "gen_tok_per_s": re.compile(r"gen throughput\s*\((?:token|tok)s?/s\)\s*:\s*([0-9.]+)", re.IGNORECASE),
    "queued": re.compile(r"#queue[- _]reqs?\s*:\s*(\d+)", re.IGNORECASE),
}
LOG_TIME = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)")


def _metric_key(name: str) -> str | None:
    for prefix in ("sglang:", "sglang_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return None


def parse_metrics(text: str) -> dict[str, float]:
    """Parse a Prometheus text exposition from SGLang into status fields.

    Label sets of one metric (tp/dp ranks, cache sources) are summed for counters and
    throughputs and averaged for ratios. Counters are matched with or without the ``_total``
    suffix. Returns only the fields present. Raises ``ValueError`` on text that is not
    Prometheus exposition format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    acc: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = _metric_key(sample.name)
            if key is None:
                continue
            if key not in METRICS and key + "_total" in METRICS:
                key += "_total"
            if key not in METRICS:
                continue
            acc.setdefault(key, []).append(float(sample.value))
    out: dict[str, float] = {}
    for key, values in acc.items():
        field, how = METRICS[key]
        out[field] = sum(values) if how == "sum" else sum(values) / len(values)
    e2e_sum, e2e_count = out.pop("_e2e_sum", None), out.pop("_e2e_count", None)
    if e2e_sum is not None and e2e_count:
        out["mean_e2e_s"] = e2e_sum / e2e_count
    return out


def parse_decode_line(line: str) -> dict[str, float]:
    """The figures of one ``Decode batch`` log line (only those present)."""
    out: dict[str, float] = {}
    for field, rx in LOG_FIELDS.items():
        m = rx.search(line)
        if m:
            out[field] = float(m.group(1))
    return out


def last_decode_stats(log: Path | None, max_bytes: int = 1 << 20) -> tuple[dict[str, float], str | None] | None:
    """The figures and timestamp of the latest ``Decode batch`` line in the last ``max_bytes``
    of ``log``; ``None`` when there is no such line or the log cannot be read."""
    from dqa.regen.fleet.logs import read_tail

    data = read_tail(log, max_bytes)
    if data is None:
        return None
    for line in reversed(data.split("\n")):
        if DECODE_LINE.search(line):
            stats = parse_decode_line(line)
            if stats:
                m = LOG_TIME.search(line)
                return stats, (m.group(1) if m else None)
    return None


def endpoint_status(fleet, ep, st, timeout: float) -> None:
    """Fill in ``st`` from ``/metrics`` when the server is up and exports it, else from the
    latest ``Decode batch`` line of its log (``fleet.log_path(ep)``)."""
    note = None
    if st.up:
        m = http_get(ep.url + "/metrics", timeout)
        if m is not None and m.status_code == 200:
            try:
                figures = parse_metrics(m.text)
            except ValueError:
                figures = {}
                note = "unparsable /metrics"
            if figures:
                for k, v in figures.items():
                    setattr(st, k, v)
                st.source = "metrics"
                return
        elif m is not None:
            note = f"/metrics answered {m.status_code} (start SGLang with --enable-metrics)"
    found = last_decode_stats(fleet.log_path(ep))
    if found is not None:
        stats, when = found
        for k in ("gen_tok_per_s", "running", "queued", "kv_usage", "accept_len", "accept_rate"):
            if k in stats:
                setattr(st, k, stats[k])
        st.source = "log"
        st.log_time = when
        st.note = "from the latest Decode batch log line" + (f"; {note}" if note else "")
    else:
        st.note = note or ("no metrics and no decode log line yet" if st.up else None)


# ------------------------------------------------------------------------------ the kind


class Sglang(ServerKind):
    name = "sglang"
    protocol = "sglang"
    # /health_generate runs a 1-token generation (real liveness); /health may be a cheap 200.
    health_paths = ("/health_generate", "/health")
    launchable = True
    options = SglangOptions

    async def preflight(self, transport, url: str, name: str, facts, timeout: float) -> str | None:
        """A server that is not SGLang and has no ``/generate`` (``GET`` answers 404; SGLang's
        POST-only route answers 405) is the wrong protocol."""
        if facts.kind == "sglang":
            return None
        from dqa.regen.servers.facts import redirected, route_status

        status = await route_status(transport, url + SglangProtocol.path, timeout)
        if (moved := redirected(name, SglangProtocol.path, status)) is not None:
            return moved
        if status == 404:
            what = "an OpenAI-compatible server" if facts.kind == "openai" else "not an SGLang server"
            return f"{name}: this server has no /generate ({what}): use --protocol openai"
        return None

    def make_protocol(self, sampling, spec, model: str) -> Protocol:
        """``POST /generate`` with the prompt tokens as they are."""
        return SglangProtocol(sampling, model)

    def missing_model_notes(self, spec) -> list[str]:
        opts = spec.engine_options
        if opts.mtp and opts.mamba_extra_buffer == "auto":
            return [(
                "hybrid-Mamba detection (--mtp with --mamba-extra-buffer auto) needs its config.json: "
                "assumed not hybrid, so no extra_buffer Mamba cache strategy (pass --mamba-extra-buffer on for a hybrid model)"
            )]
        return []

    def prepare(self, spec, model_dir, notes: list[str]) -> SglangOptions:
        """Whether the model is hybrid Mamba (read from ``model_dir``'s config.json; a model that
        is not here: not hybrid), and, when the Mamba cache strategy flag depends on it, the
        SGLang release of the servers' Python (else ``NEWEST_KNOWN``, and a note)."""
        opts = spec.engine_options
        if opts.hybrid is None:
            opts = dataclasses.replace(opts, hybrid=is_hybrid_mamba(str(model_dir)) if model_dir is not None else False)
        if opts.sglang_version is None and wants_extra_buffer(dataclasses.replace(spec, engine_options=opts)):
            # The Mamba cache strategy flag differs between releases: ask the servers' Python.
            found = installed_sglang_version(spec.python)
            if found is not None:
                opts = dataclasses.replace(opts, sglang_version=found)
            else:
                flags = " ".join(mamba_extra_buffer_flags(parse_version(NEWEST_KNOWN))) or "no Mamba cache strategy flag"
                notes.append(
                    f"the SGLang release of {spec.python} could not be asked; assumed {NEWEST_KNOWN} (the newest known), "
                    f"so {flags} (pass --sglang-version for another release: <=0.5.13 takes --mamba-scheduler-strategy extra_buffer, "
                    "0.5.14-0.5.19 --mamba-radix-cache-strategy extra_buffer)"
                )
        return opts

    def launch_argv(self, spec, port: int) -> list[str]:
        return launch_argv(spec, port)

    def status(self, fleet, ep, st, timeout: float) -> None:
        endpoint_status(fleet, ep, st, timeout)


KIND = Sglang()
