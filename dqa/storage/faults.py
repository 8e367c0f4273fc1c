"""A store's failures as dqa's errors: one line naming the URL and the cause, the right exit code.

pyarrow's filesystems raise ``OSError`` whose message carries the SDK's error name
(``AWS Error ACCESS_DENIED during HeadObject operation: ...``) after the SDK's own retries with
backoff. ``store_error(exc, url)`` reads it:

- the request was wrong (``INPUT_ERRORS``: no such bucket or key, access denied, bad or
  expired credentials): ``InputError``, exit 2, with the fix;
- the store failed (throttling that outlasted the retries, 5xx, a dropped connection, a
  timeout, anything else): ``RuntimeFailure``, exit 3; rerunning the command resumes or redoes it.

Messages never hold a credential: pyarrow does not print them, and ``user:password@`` is
stripped from any URL in the text all the same.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

from dqa.errors import DqaError, InputError, RuntimeFailure

_AWS = re.compile(r"AWS Error (?P<code>[A-Z_]+)(?: \(HTTP status (?P<status>\d+)\))? during (?P<op>\w+) operation: ?(?P<detail>[^(\n]*)")
_WHERE = re.compile(r"(?:key '(?P<key>[^']*)' in )?bucket '(?P<bucket>[^']*)'")
# scheme://userinfo@ : userinfo stops at the first "/", "?", "#" or space, so an "@" later in a
# path or query is left alone (RFC 3986 requires "@" and "/" inside a password to be escaped).
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s@]*@")
INPUT_ERRORS = {
    "NO_SUCH_BUCKET": "no such bucket",
    "NO_SUCH_KEY": "no such key",
    "RESOURCE_NOT_FOUND": "not found",
    "ACCESS_DENIED": "access denied",
    "INVALID_ACCESS_KEY_ID": "the access key is not known to the store",
    "SIGNATURE_DOES_NOT_MATCH": "the secret key does not match the access key",
    "MISSING_AUTHENTICATION_TOKEN": "no credentials were sent",
    "INVALID_CLIENT_TOKEN_ID": "the credentials are not valid",
    "EXPIRED_TOKEN": "the session token has expired",
    "UNRECOGNIZED_CLIENT": "the credentials are not valid",
}
_CREDENTIALS_FIX = "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE) or give --storage-option"


def store_error(exc: OSError, url: str) -> DqaError:
    """The ``InputError`` or ``RuntimeFailure`` for an ``OSError`` a store raised while working on ``url``."""
    text = " ".join(str(exc).split())
    m = _AWS.search(text)
    if isinstance(exc, FileNotFoundError) and not m:
        return InputError(without_credentials(f"{url}: no such file or folder in the store"))
    if m is None:
        return RuntimeFailure(without_credentials(f"{url}: the store failed ({text[:200]}); rerun to retry"))
    code, op = m["code"], m["op"]
    where = _WHERE.search(text)
    if where is not None and where["bucket"]:
        scheme = url.split("://", 1)[0] if "://" in url else "s3"
        url = f"{scheme}://{where['bucket']}/{where['key'] or ''}".rstrip("/")
    if code in INPUT_ERRORS:
        fix = _CREDENTIALS_FIX if code not in ("NO_SUCH_BUCKET", "NO_SUCH_KEY", "RESOURCE_NOT_FOUND") else "check the URL"
        return InputError(without_credentials(f"{url}: {INPUT_ERRORS[code]} ({code} during {op}); {fix}"))
    detail = m["detail"].strip().rstrip(";")
    status = f", HTTP {m['status']}" if m["status"] else ""
    failure = RuntimeFailure(without_credentials(f"{url}: the store failed after its retries ({code} during {op}{status}: {detail[:120]}); rerun to retry"))
    # The SDK gives up at once on an error reply too long for a small ranged read's buffer ("Failed to flush
    # response stream", INTERNAL_FAILURE: a 503 SlowDown's XML does not fit), and after its retries on the rest:
    # a caller that can redo its piece of work (a scan unit) may try again.
    failure.transient = True  # type: ignore[attr-defined]
    return failure


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a store failure (``store_error``'s ``RuntimeFailure``) that redoing the work may get past."""
    return bool(getattr(exc, "transient", False))


def is_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an SDK error raised by one of pyarrow's store filesystems."""
    return isinstance(exc, OSError) and "AWS Error" in str(exc)


@contextlib.contextmanager
def store_errors(url: str) -> Iterator[None]:
    """Turn the store's ``OSError`` inside the block into ``store_error(exc, url)``."""
    try:
        yield
    except DqaError:
        raise
    except OSError as exc:
        raise store_error(exc, url) from None


def without_credentials(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it removed."""
    return _USERINFO.sub(r"\1", text)

