"""The seams issue 37 drew, checked on their own (no server kind, no run):

- ``DispatchSettings`` is derived from the dispatch group, not copied: each option read from its
  spec path, each default the option's;
- what an SGLang router changes is answered by ``ServerFacts`` (``retries_itself``,
  ``no_capacity``, ``settle``), so the dispatcher and the run never ask whether it is one;
- the probes' GET (``wire.http_probe``) goes over aiohttp and keeps httpx's answers: any status
  comes back, nothing answering is None.
"""

from __future__ import annotations

import threading
from dataclasses import fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dqa.errors import UsageError
from dqa.regen.config import DispatchSpec, Retries, Timeouts
from dqa.regen.dispatch.scheduler import DispatchSettings
from dqa.regen.servers.facts import facts_from, settle
from dqa.regen.wire.http_probe import answers_ok, http_get


def test_dispatch_settings_read_every_option_of_the_dispatch_group():
    d = DispatchSpec(endpoints=("http://127.0.0.1:1",), max_in_flight=7, context_length=99, sticky=False,
                     timeouts=Timeouts(request=5.5, connect=2.5, health=3.5, health_interval=4.5, down_deadline=6.5, sticky_wait=7.5),
                     retries=Retries(max_attempts=2, backoff_base=0.1, backoff_max=0.2, fail_threshold=9))
    s = DispatchSettings.from_spec(d)
    assert (s.max_in_flight, s.context_length, s.sticky) == (7, 99, False)
    assert (s.request_timeout, s.connect_timeout, s.health_timeout, s.health_interval, s.down_deadline, s.sticky_wait) == (
        5.5, 2.5, 3.5, 4.5, 6.5, 7.5)
    assert (s.max_attempts, s.backoff_base, s.backoff_max, s.fail_threshold) == (2, 0.1, 0.2, 9)
    # Every field but the probe backoff's ceiling names where it comes from.
    assert [f.name for f in fields(DispatchSettings) if "spec" not in f.metadata] == ["probe_max_interval"]


def test_dispatch_settings_defaults_are_the_options_defaults():
    assert DispatchSettings() == DispatchSettings.from_spec(DispatchSpec(endpoints=("http://127.0.0.1:1",)))
    assert (DispatchSettings().connect_timeout, DispatchSettings().request_timeout) == (Timeouts().connect, Timeouts().request)


ROUTER_INFO = {"router_manager": True}


def test_a_router_retries_itself_and_says_when_no_worker_is_there():
    plain = facts_from({"version": "0.5.23", "context_length": 4096}, None)
    router = facts_from(ROUTER_INFO, None)
    assert not plain.retries_itself and router.retries_itself
    error = 'HTTP 503: {"error": {"code": "no_available_workers", "message": "No available workers"}}'
    assert plain.no_capacity(error) is None
    assert router.no_capacity(error) == "the router has no available worker"
    assert router.no_capacity("HTTP 503: queue full") is None


def test_settle_caps_a_router_by_context_length_and_names_the_dropped_fields():
    router = facts_from(ROUTER_INFO, None)
    with pytest.raises(UsageError, match="--context-length"):
        settle("http://r", router, None, ("max_new_tokens",))  # never uncapped through a router
    sent = ("max_new_tokens", "temperature", "not_a_sampling_key")
    # Its release as the fleet file that launched it records it: the table says what it passes on.
    note = settle("http://r", router, 4096, sent, {"name": "sglang-router", "version": "0.3.2"})
    assert router.context_length == 4096 and router.router["context_from"] == "--context-length"
    assert note is not None and "(sglang-router 0.3.2) drops not_a_sampling_key" in note
    assert router.router["sampling_fields"] == {"max_new_tokens": "applied", "temperature": "applied", "not_a_sampling_key": "dropped"}
    assert (router.router["release"], router.router["release_from"]) == ("0.3.2", "fleet file")


@pytest.mark.parametrize("declared", [None, {"name": "smg", "version": "1.13.0"}, {"name": "sglang-router", "version": "0.9.9"}])
def test_a_gateway_release_that_is_not_known_or_not_in_the_table_records_every_field_unknown(declared):
    """Not said (``-e URL``: neither gateway tells its release over HTTP), a fleet file naming
    another gateway than the one that answers, or a release the table does not hold: unknown,
    never a guess."""
    router = facts_from(ROUTER_INFO, None)
    note = settle("http://r", router, 4096, ("max_new_tokens", "not_a_sampling_key"), declared)
    assert router.router["sampling_fields"] == {"max_new_tokens": "unknown", "not_a_sampling_key": "unknown"}
    assert router.router["release"] == (declared["version"] if declared and declared["name"] == "sglang-router" else None)
    assert note is not None and "which sampling fields it passes on is not known" in note


def test_smg_is_recognised_by_its_own_404_on_server_info_not_by_the_worker_reply_it_passes_on():
    """smg 1.13.0 answers /get_server_info with ONE worker's reply; its /server_info is a 404
    with its error code unknown_url (both as the real smg printed them)."""
    worker_info = {"version": "0.5.23", "context_length": 2048, "port": 46349}
    missing = {"error": {"type": "invalid_request_error", "code": "unknown_url", "message": "Invalid URL (GET /server_info)"}}
    f = facts_from(worker_info, None, missing)
    assert f.retries_itself and f.router["gateway"] == "smg" and f.context_length is None and f.version is None
    assert facts_from(worker_info, None, {"detail": "Not Found"}).router is None  # an older SGLang's 404
    plain = facts_from({"version": "0.5.23", "context_length": 8192}, None)
    assert settle("http://s", plain, 4096, ("max_new_tokens",)) is None and plain.context_length == 4096


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802
        status, body = {"/health": (200, b"ok"), "/starting": (503, b"starting")}.get(self.path, (404, b"no such route"))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


def test_a_probe_gets_any_status_and_none_when_nothing_answers(server):
    r = http_get(server + "/health", 5.0)
    assert (r.status_code, r.text) == (200, "ok")
    r = http_get(server + "/starting", 5.0)
    assert (r.status_code, r.text) == (503, "starting")
    assert answers_ok(server + "/health", 5.0) and not answers_ok(server + "/starting", 5.0)
    with socket_closed() as url:
        assert http_get(url + "/health", 2.0) is None and not answers_ok(url + "/health", 2.0)


def test_a_probe_from_inside_a_running_event_loop_still_answers(server):
    import asyncio

    async def inside() -> int:
        r = http_get(server + "/health", 5.0)
        return r.status_code

    assert asyncio.run(inside()) == 200


class socket_closed:
    """A URL on a port nothing listens on (bound, then closed)."""

    def __enter__(self) -> str:
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        return None
