"""Which filesystem a URL gets, and the storage options that shape it.

``filesystem(scheme, bucket)`` returns a ``pyarrow.fs.FileSystem`` and whether paths in it are
``bucket/key`` (pyarrow's own filesystems) or fsspec's paths:

- ``s3://`` (and ``s3a://``): ``pyarrow.fs.S3FileSystem``. Credentials come from the AWS SDK's
  own chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
  ``AWS_PROFILE`` and the shared config files, instance roles); the endpoint from
  ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (MinIO, R2, a test server), the region from
  ``AWS_REGION``/``AWS_DEFAULT_REGION``, the retries from ``AWS_MAX_ATTEMPTS`` (the SDK's
  standard strategy with exponential backoff, ``DEFAULT_MAX_ATTEMPTS`` when unset).
- ``gs://`` / ``gcs://``: ``pyarrow.fs.GcsFileSystem`` (``GOOGLE_APPLICATION_CREDENTIALS`` or
  the default credentials).
- ``abfs://`` / ``az://``, ``hdfs://``: pyarrow's ``FileSystem.from_uri``.
- anything else (``hf://``, ``memory://``, ...): fsspec's backend for the scheme, as
  ``PyFileSystem(FSSpecHandler(fs))``. A backend that is not installed is an ``InputError``
  naming the extra that installs it (``BACKEND_EXTRAS``).

``configure(options)`` sets the ``--storage-option KEY=VALUE`` pairs for the process: for S3 the
keys of ``S3_OPTIONS`` (``endpoint_url``, ``region``, ``anonymous``, ...), for fsspec backends
the backend's own keyword arguments. Filesystems are made once per scheme and bucket.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Iterable

from dqa.errors import InputError, UsageError

DEFAULT_MAX_ATTEMPTS = 6  # the AWS SDK's standard retry strategy: exponential backoff with jitter
NATIVE = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "abfs": "azure", "abfss": "azure", "az": "azure", "hdfs": "hdfs"}
BACKEND_EXTRAS = {"hf": "hf", "gcs": "gcs", "gs": "gcs", "s3": "s3", "az": "azure", "abfs": "azure"}
# --storage-option keys for S3 -> pyarrow.fs.S3FileSystem arguments (values parsed as their types).
S3_OPTIONS = {
    "endpoint_url": ("endpoint_override", str),
    "endpoint_override": ("endpoint_override", str),
    "region": ("region", str),
    "access_key": ("access_key", str),
    "secret_key": ("secret_key", str),
    "session_token": ("session_token", str),
    "anonymous": ("anonymous", bool),
    "scheme": ("scheme", str),
    "request_timeout": ("request_timeout", float),
    "connect_timeout": ("connect_timeout", float),
    "force_virtual_addressing": ("force_virtual_addressing", bool),
    "max_attempts": ("max_attempts", int),
}

_ENVIRONMENT = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_MAX_ATTEMPTS",
                "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
_options: dict[str, str] = {}
_made: dict[tuple, Any] = {}
_lock = threading.Lock()


def parse_options(pairs: Iterable[str]) -> dict[str, str]:
    """``{KEY: VALUE}`` of ``KEY=VALUE`` strings (``--storage-option``). Raises ``UsageError`` for one without ``=``."""
    out: dict[str, str] = {}
    for p in pairs:
        key, eq, value = p.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"--storage-option {p.split('=')[0]!r}: expected KEY=VALUE (e.g. endpoint_url=http://127.0.0.1:9000)")
        out[key.strip()] = value
    return out


def configure(options: dict[str, str] | Iterable[str] | None) -> None:
    """Use ``options`` (a dict, or ``KEY=VALUE`` strings) for every store this process opens from now on."""
    given = options if isinstance(options, dict) else parse_options(options or [])
    with _lock:
        _options.clear()
        _options.update(given)
        _made.clear()


def filesystem(scheme: str, bucket: str, given: dict[str, str] | None = None) -> tuple[Any, bool]:
    """``(pyarrow filesystem, native)`` for a URL's scheme and bucket (netloc); ``native``: paths are ``bucket/key``.
    ``given``: options from the URL itself (its ``KEY:SECRET@``), over the configured ones.

    Raises ``InputError`` naming the extra for a scheme whose backend is not installed, and for
    a storage option the backend does not take.
    """
    scheme = scheme.lower()
    env = tuple(os.environ.get(v) for v in _ENVIRONMENT)  # a test or a caller may point the SDK elsewhere
    options = {**_options, **(given or {})}
    key = (scheme, bucket if NATIVE.get(scheme) != "s3" else "", tuple(sorted(options.items())), env)
    with _lock:
        fs = _made.get(key)
    if fs is None:
        fs = _make(scheme, bucket, options)
        with _lock:
            _made[key] = fs
    return fs, scheme in NATIVE


def _make(scheme: str, bucket: str, options: dict[str, str]) -> Any:
    import pyarrow.fs as pafs

    kind = NATIVE.get(scheme)
    if kind == "s3":
        return pafs.S3FileSystem(**s3_arguments(options))
    if kind == "gcs":
        return pafs.GcsFileSystem(**_typed(options))
    if kind is not None:
        try:
            return pafs.FileSystem.from_uri(f"{scheme}://{bucket}/")[0]
        except (OSError, ValueError) as exc:
            raise InputError(f"{scheme}://{bucket}: cannot open this store ({exc})") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(_fsspec(scheme, options)))


def s3_arguments(options: dict[str, str]) -> dict[str, Any]:
    """``pyarrow.fs.S3FileSystem`` arguments from the standard AWS environment, then ``options``.

    Raises ``InputError`` for an option S3 does not take or a value of the wrong type.
    """
    import pyarrow.fs as pafs

    args: dict[str, Any] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        args["endpoint_override"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        args["region"] = region
    attempts = os.environ.get("AWS_MAX_ATTEMPTS")
    max_attempts = _value("AWS_MAX_ATTEMPTS", attempts, int) if attempts else DEFAULT_MAX_ATTEMPTS
    for k, v in options.items():
        if k not in S3_OPTIONS:
            raise InputError(f"--storage-option {k}: not an S3 option (known: {', '.join(sorted(S3_OPTIONS))})")
        name, typ = S3_OPTIONS[k]
        if name == "max_attempts":
            max_attempts = _value(k, v, int)
        else:
            args[name] = _value(k, v, typ)
    args["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=max_attempts)
    return args


def _value(key: str, text: str, typ: type) -> Any:
    if typ is bool:
        low = text.strip().lower()
        if low not in ("1", "0", "true", "false", "yes", "no"):
            raise InputError(f"--storage-option {key}={text}: expected true or false")
        return low in ("1", "true", "yes")
    try:
        return typ(text)
    except ValueError:
        raise InputError(f"--storage-option {key}={text}: expected a {typ.__name__}") from None


def _typed(options: dict[str, str]) -> dict[str, Any]:
    """Options for a backend that documents no types: ``true``/``false`` and numbers parsed, the rest as text."""
    out: dict[str, Any] = {}
    for k, v in options.items():
        low = v.strip().lower()
        if low in ("true", "false"):
            out[k] = low == "true"
        else:
            try:
                out[k] = int(v)
            except ValueError:
                try:
                    out[k] = float(v)
                except ValueError:
                    out[k] = v
    return out


def _fsspec(scheme: str, options: dict[str, str]) -> Any:
    """fsspec's filesystem for ``scheme``. Raises ``InputError`` naming the extra (or package) that provides it."""
    try:
        import fsspec
    except ImportError:  # pragma: no cover - a base dependency
        raise InputError(f"{scheme}:// URLs need fsspec: pip install fsspec") from None
    try:
        return fsspec.filesystem(scheme, **_typed(options))
    except ImportError as exc:
        extra = BACKEND_EXTRAS.get(scheme)
        fix = f"pip install 'dqa[{extra}]'" if extra else f"install the fsspec backend for {scheme}:// ({exc})"
        raise InputError(f"{scheme}:// URLs need a backend that is not installed: {fix}") from None
    except ValueError as exc:
        raise InputError(f"{scheme}://: no storage backend knows this scheme ({exc})") from None
    except TypeError as exc:
        raise InputError(f"{scheme}://: a --storage-option this backend does not take ({exc})") from None
