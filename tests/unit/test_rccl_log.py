"""Which network RCCL chose, from its log, and the variables that make rank 0 write that log.

No AMD GPU, RDMA NIC or RCCL runs here: the logs are written by hand in RCCL's formats (ROCm/rccl's
src/debug.cc, src/init.cc, src/transport/net_ib.cc and net_socket.cc, cited in `rccl_log`).
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest

from fakes import Sent
from rocmtrain.api.models import NetworkTransport
from rocmtrain_train import sdk
from rocmtrain_train.reporting import rccl_log

PREFIX = "node-0:4242:4300 [0] NCCL INFO "
ROCE = f"""\
{PREFIX}Bootstrap : Using eth0:10.244.1.5<0>
{PREFIX}NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB net1:10.10.0.5<0>
{PREFIX}Using network IB
{PREFIX}comm 0x5581 rank 0 nranks 16 cudaDev 0 busId 1b000 commId 0x9e - Init START
"""
INFINIBAND_MERGED = f"""\
{PREFIX}NET/IB : Using [0]={{[0] mlx5_0:1/IB, [1] mlx5_1:1/IB}} [1]mlx5_2:1/IB ; OOB ib0:10.20.0.5<0>
{PREFIX}Using network IB
"""
SOCKET = f"""\
{PREFIX}NET/IB : No device found.
{PREFIX}NET/Socket : Using [0]eth0:10.244.1.5<0> [1]net1:fe80::1%net1<0>
{PREFIX}Using network Socket
"""
PLUGIN = f"""\
{PREFIX}NET/OFI Selected Provider is efa (found 4 nics)
{PREFIX}Using network AWS Libfabric
"""
WARN = "\nnode-0:4242:4300 [0] transport/net_ib.cc:1010 NCCL WARN NET/IB : Got async event : port error\n"


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (ROCE, NetworkTransport(transport="IB", devices=["mlx5_0:1", "mlx5_1:1"], link="RoCE")),
        (
            INFINIBAND_MERGED,
            NetworkTransport(transport="IB", devices=["mlx5_0:1", "mlx5_1:1", "mlx5_2:1"], link="InfiniBand"),
        ),
        (SOCKET, NetworkTransport(transport="Socket", devices=["eth0", "net1"])),
        (PLUGIN, NetworkTransport(transport="AWS Libfabric")),
        (
            ROCE.replace("[1]mlx5_1:1/RoCE", "[1]mlx5_1:1/IB"),
            NetworkTransport(transport="IB", devices=["mlx5_0:1", "mlx5_1:1"], link="mixed"),
        ),
    ],
)
def test_the_chosen_network_and_its_devices(log: str, expected: NetworkTransport):
    assert rccl_log.parse_transport(log) == expected


def test_summary_is_one_line():
    assert rccl_log.parse_transport(ROCE).summary == "IB over mlx5_0:1, mlx5_1:1 (RoCE)"
    assert rccl_log.parse_transport(SOCKET).summary == "Socket over eth0, net1"


@pytest.mark.parametrize(
    "log",
    [
        "",
        f"{PREFIX}NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:10.0.0.5<0>\n",  # devices, but no choice
        "Using network IB\n",  # not RCCL's line
        f"{PREFIX}Using network {'x' * 65}\n",  # longer than the status takes
        "some training output\nNCCL version 2.21.5+hip6.3\n",
    ],
)
def test_a_log_that_does_not_tell(log: str):
    assert rccl_log.parse_transport(log) is None


def test_devices_are_bounded_and_named_as_the_status_takes_them():
    devices = " ".join(f"[{i}]mlx5_{i}:1/RoCE" for i in range(40))
    log = f"{PREFIX}NET/IB : Using [99]{'x' * 70}:1/RoCE {devices} ; OOB eth0:1.2.3.4<0>\n{PREFIX}Using network IB\n"
    found = rccl_log.parse_transport(log)
    assert found is not None and found.devices == [f"mlx5_{i}:1" for i in range(16)]


def test_warnings_are_found():
    assert rccl_log.warning_messages(ROCE + WARN) == ["NET/IB : Got async event : port error"]
    assert rccl_log.warning_messages(ROCE) == []


@pytest.mark.parametrize(
    ("environ", "sets", "reads"),
    [
        ({}, True, "/runs/job/logs/rccl-rank-0.log"),
        ({"NCCL_DEBUG": "WARN"}, True, "/runs/job/logs/rccl-rank-0.log"),  # the operator's default
        ({"NCCL_DEBUG": "INFO"}, False, None),  # the user's, on the output
        ({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "ALL"}, False, None),
        ({"NCCL_DEBUG_SUBSYS": "COLL"}, False, None),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p"}, False, "/tmp/nccl.%h.%p"),  # theirs, read
    ],
)
def test_rank_zero_writes_rccl_init_and_net_lines_to_a_file_unless_the_user_set_theirs(environ, sets, reads):
    env, template = rccl_log.debug_env(environ, "/runs/job/logs")
    assert template == reads
    expected = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": reads} if sets else {}
    assert env == expected


def test_debug_file_is_expanded_as_rccl_does():
    assert rccl_log.debug_file("/logs/nccl-%h-%p.%%.%x", "node-0.cluster.local", 42) == "/logs/nccl-node-0-42.%.%x"
    env, template = rccl_log.debug_env({}, "/runs/50%/logs")
    assert env["NCCL_DEBUG_FILE"] == template == "/runs/50%%/logs/rccl-rank-0.log"
    assert rccl_log.debug_file(template, "node-0", 1) == "/runs/50%/logs/rccl-rank-0.log"


def test_read_transport_reads_this_process_file_and_logs_rccl_warnings(tmp_path, caplog):
    log = logging.getLogger("test.rccl")
    (tmp_path / "nccl-node-0-42.log").write_text(SOCKET + WARN)
    with caplog.at_level(logging.INFO, logger="test.rccl"):
        found = rccl_log.read_transport(str(tmp_path / "nccl-%h-%p.log"), "node-0", 42, log)
    assert found is not None and found.transport == "Socket"
    assert "RCCL: NET/IB : Got async event : port error" in caplog.text
    assert rccl_log.read_transport(str(tmp_path / "nccl-%h-%p.log"), "node-0", 43, log) is None, "no file"
    assert rccl_log.read_transport(None, "node-0", 42, log) is None, "no file known"


@pytest.fixture
def sdk_reports(monkeypatch: pytest.MonkeyPatch) -> Sent:
    """`sdk.report` on rank 0, into a `Sent` sink (no Ray, no endpoint)."""
    sent = Sent()
    reporter = sdk._Reporter()
    reporter.sink = sent  # type: ignore[assignment]
    monkeypatch.setattr(sdk, "_reporter", lambda: reporter)
    monkeypatch.setattr(sdk, "is_reporting_rank", lambda: True)
    return sent


def test_own_codes_rank_zero_reports_its_network_once_rccl_has_written_its_log(
    sdk_reports: Sent, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The log is written by hand, as RCCL writes it at its first communicator: no RCCL runs here."""
    template = str(tmp_path / "nccl-%h-%p.log")
    monkeypatch.setenv("NCCL_DEBUG_FILE", template)  # what `rccl_debug` sets on rank 0, or the user's own
    written = Path(rccl_log.debug_file(template, socket.gethostname(), os.getpid()))
    with caplog.at_level(logging.INFO, logger=sdk.log.name):
        sdk.report(step=1, total_steps=10)  # before the first collective: no file yet
        written.write_text(ROCE + WARN)
        sdk.report(step=2, total_steps=10)
        written.write_text(SOCKET)  # read once: a later change is not read
        sdk.report(step=3, total_steps=10)
    networks = [report.dump().get("network") for report in sdk_reports.reports]
    roce = {"transport": "IB", "devices": ["mlx5_0:1", "mlx5_1:1"], "link": "RoCE"}
    assert networks == [None, roce, roce]
    assert caplog.text.count("RCCL transport: IB over mlx5_0:1, mlx5_1:1 (RoCE)") == 1
    assert caplog.text.count("RCCL: NET/IB : Got async event : port error") == 1


def test_own_code_without_an_rccl_log_reports_no_network(sdk_reports: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """CPUs (gloo), or the user's NCCL_DEBUG on the output: no file to read."""
    monkeypatch.delenv("NCCL_DEBUG_FILE", raising=False)
    sdk.report(step=1, total_steps=10)
    assert "network" not in sdk_reports.reports[0].dump()
