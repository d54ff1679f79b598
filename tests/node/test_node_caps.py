"""The node agent's caps (node/caps.py) against what a real node does to a board behind
its back: a GPU falling off the bus, a BMC limiting it, a reset, a reboot, a write NVML
refuses, a pod's name given to another pod, a request in flight while the agent stops.
Each puts back exactly the limit that is the agent's to put back, and no other."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

from throttledjob.gpu.backend import GpuError, GpuReading
from throttledjob.gpu.fake import TDP_WATTS, FakeGpuBackend, fake_uuid
from throttledjob.node.caps import CapKeeper
from throttledjob.node.identity import PodRef
from throttledjob.node.process import Node

POD_A = PodRef("team", "train-a", "8b1f7f4e-0000-4000-8000-00000000000a", power_cap=True)
POD_B = PodRef("team", "train-b", "8b1f7f4e-0000-4000-8000-00000000000b", power_cap=True)


class OneGpuLost(FakeGpuBackend):
    """A board whose every-GPU read fails once one GPU is off the bus, as NVML's did
    (NVML_ERROR_GPU_IS_LOST from one handle failed the list)."""

    lost = False

    def read(self) -> list[GpuReading]:
        if self.lost:
            raise GpuError("NVML: GPU is lost", lost=True)
        return super().read()


def test_a_gpu_lost_stops_no_other_gpus_cap_or_restore(tmp_path: Path) -> None:
    board = OneGpuLost(3, "steady")
    g0, g1, _ = board.read()
    keeper = CapKeeper(board, tmp_path / "caps.json")
    keeper.set_limit(g0, POD_A, 150.0)
    board.lost = True   # GPU 2 falls off the bus
    assert keeper.set_limit(g1, POD_B, 180.0) == 180.0
    keeper.restore_pod(POD_A.uid)
    assert board.limits[:2] == [TDP_WATTS, 180.0]
    keeper.stop()
    assert board.limits == [TDP_WATTS] * 3 and keeper.caps == {}


class LostOnLookup(FakeGpuBackend):
    def index_of(self, uuid: str) -> int | None:
        if uuid == fake_uuid(1):
            raise GpuError("NVML: GPU is lost", lost=True)
        return super().index_of(uuid)


def test_a_lost_gpus_cap_is_forgotten_and_the_others_put_back(tmp_path: Path, caplog) -> None:
    board = LostOnLookup(2, "steady")
    keeper = CapKeeper(board, tmp_path / "caps.json")
    for gpu in board.read():
        keeper.set_limit(gpu, POD_A, 150.0)
    keeper.restore_all()
    assert board.limits[0] == TDP_WATTS and keeper.caps == {}
    assert any(f"GPU {fake_uuid(1)} is gone" in r.message for r in caplog.records)


def test_the_original_is_the_boards_own_limit_not_what_a_bmc_enforces(tmp_path: Path) -> None:
    """The enforced limit counts out-of-band limiters: written back as the board's own,
    it would keep their cut after they lifted it."""
    board = FakeGpuBackend(1, "steady")
    board.out_of_band_limits[0] = 250.0   # the BMC holds the board lower for a while
    (gpu,) = board.read()
    assert gpu.power_limit_watts == 250.0
    keeper = CapKeeper(board, tmp_path / "caps.json")
    assert keeper.set_limit(gpu, POD_A, 200.0) == 200.0
    assert keeper.caps[gpu.uuid].original_watts == TDP_WATTS
    assert keeper.set_limit(gpu, POD_A, 280.0) == 280.0   # under the board's own 300
    keeper.restore(gpu.uuid)
    assert board.limits == [TDP_WATTS]


@pytest.mark.parametrize("changed_to", [TDP_WATTS, 280.0, 120.0])
def test_a_limit_changed_since_the_cap_is_left_as_it_is(tmp_path: Path, caplog,
                                                        changed_to: float) -> None:
    """A GPU reset or a driver reload (the board's default back), or an admin's own
    limit: the record's original is stale, and writing it would undo someone else."""
    board = FakeGpuBackend(1, "steady")
    (gpu,) = board.read()
    keeper = CapKeeper(board, tmp_path / "caps.json")
    keeper.set_limit(gpu, POD_A, 150.0)
    board.limits[0] = changed_to
    calls = len(board.limit_calls)
    keeper.restore_pod(POD_A.uid)
    assert board.limits == [changed_to] and len(board.limit_calls) == calls
    assert keeper.caps == {}
    assert len([r for r in caplog.records if "left as it is" in r.message]) == 1


def test_a_new_cap_over_a_limit_changed_since_takes_that_limit_as_the_original(
        tmp_path: Path) -> None:
    board = FakeGpuBackend(1, "steady")
    (gpu,) = board.read()
    keeper = CapKeeper(board, tmp_path / "caps.json")
    keeper.set_limit(gpu, POD_A, 150.0)
    board.limits[0] = 200.0   # an admin's limit, set while capped
    assert keeper.set_limit(gpu, POD_A, 250.0) == 200.0   # never raised over it
    assert board.limits == [200.0] and keeper.caps == {}


def test_caps_of_another_boot_are_dropped_not_written(tmp_path: Path, caplog) -> None:
    board = FakeGpuBackend(1, "steady")
    (gpu,) = board.read()
    CapKeeper(board, tmp_path / "caps.json", boot="boot-1").set_limit(gpu, POD_A, 150.0)
    # Rebooted: the board came up with its own limit, then someone set 150 W again.
    board.limits[0] = 150.0
    calls = len(board.limit_calls)
    keeper = CapKeeper(board, tmp_path / "caps.json", boot="boot-2")
    keeper.stop()
    assert keeper.caps == {} and board.limits == [150.0] and len(board.limit_calls) == calls
    assert any("another boot" in r.message for r in caplog.records)


class DiesWriting(FakeGpuBackend):
    """An agent SIGKILLed in the middle of a power-limit write: after its record."""

    die = False

    def set_power_limit_watts(self, index: int, watts: float) -> None:
        if self.die:
            raise KeyboardInterrupt
        super().set_power_limit_watts(index, watts)


@pytest.mark.parametrize("written", [False, True])
def test_an_agent_killed_while_it_moved_a_cap_still_puts_the_original_back(
        tmp_path: Path, written: bool) -> None:
    board = DiesWriting(1, "steady")
    (gpu,) = board.read()
    keeper = CapKeeper(board, tmp_path / "caps.json")
    keeper.set_limit(gpu, POD_A, 150.0)
    board.die = True
    with pytest.raises(KeyboardInterrupt):
        keeper.set_limit(gpu, POD_A, 200.0)
    board.die = False
    if written:   # the board took the write, the agent died before its record's last word
        board.limits[0] = 200.0
    CapKeeper(board, tmp_path / "caps.json").restore_all()
    assert board.limits == [TDP_WATTS]


class Refuses(FakeGpuBackend):
    """NVML without the right (no CAP_SYS_ADMIN: NO_PERMISSION) or the lever."""

    refuse = True

    def set_power_limit_watts(self, index: int, watts: float) -> None:
        if self.refuse:
            raise GpuError("NVML: Insufficient Permissions")
        super().set_power_limit_watts(index, watts)


def test_a_write_the_board_refuses_leaves_no_record(tmp_path: Path) -> None:
    board = Refuses(1, "steady")
    (gpu,) = board.read()
    keeper = CapKeeper(board, tmp_path / "caps.json")
    with pytest.raises(GpuError, match="Insufficient"):
        keeper.set_limit(gpu, POD_A, 150.0)
    assert keeper.caps == {}
    assert json.loads((tmp_path / "caps.json").read_text())["caps"] == {}
    board.refuse = False
    keeper.set_limit(gpu, POD_A, 150.0)
    board.refuse = True   # a second cap refused: the first one's record stands
    with pytest.raises(GpuError):
        keeper.set_limit(gpu, POD_A, 120.0)
    assert CapKeeper(board, tmp_path / "caps.json").caps[gpu.uuid].set_watts == 150.0
    board.refuse = False
    keeper.restore_all()
    assert board.limits == [TDP_WATTS]


def test_a_cap_stays_only_while_its_pod_still_holds_that_gpu(tmp_path: Path) -> None:
    """The agent was down while pod worker-0 was deleted and made again under the same
    name, on the other GPU; its old GPU went to another pod."""
    board = FakeGpuBackend(2, "steady")
    g0, g1 = board.read()
    keeper = CapKeeper(board, tmp_path / "caps.json")
    keeper.set_limit(g0, PodRef("team", "worker-0", "u0"), 150.0)
    keeper.set_limit(g1, PodRef("team", "other", "u1"), 180.0)
    keeper.restore_gone({"team/worker-0": frozenset({g1.uuid}),
                         "team/other": frozenset({g1.uuid})})
    assert board.limits == [TDP_WATTS, 180.0] and list(keeper.caps) == [g1.uuid]


def _node(tmp_path: Path) -> tuple[FakeGpuBackend, Node]:
    board = FakeGpuBackend(1, "steady")
    node = Node(board, tmp_path / "kubelet", tmp_path / "state",
                list_gpus=lambda: {POD_A.key: frozenset({fake_uuid(0)})})
    return board, node


CAP = {"op": "set_power_limit", "uuid": fake_uuid(0), "watts": 150.0}


def test_a_request_in_flight_caps_nothing_once_the_agent_stopped(tmp_path: Path) -> None:
    """A request read before SIGTERM, answered after the caps were put back (its kubelet
    call was slow): nothing left would put its cap back."""
    board, node = _node(tmp_path)
    (tmp_path / "vol").mkdir()
    node.publish(tmp_path / "vol", POD_A)
    node.stop()
    assert "stopping" in node.agent.answer(POD_A, CAP)["error"]
    assert board.limit_calls == [] and node.keeper.caps == {}


def test_a_request_in_flight_caps_nothing_once_its_volume_went(tmp_path: Path) -> None:
    board, node = _node(tmp_path)
    (tmp_path / "vol").mkdir()
    node.publish(tmp_path / "vol", POD_A)
    assert node.agent.answer(POD_A, CAP) == {"watts": 150.0}
    node.unpublish(tmp_path / "vol")
    assert board.limits == [TDP_WATTS]
    assert "not served any more" in node.agent.answer(POD_A, CAP)["error"]
    assert board.limits == [TDP_WATTS] and node.keeper.caps == {}
    # A pod of the same name after it (a StatefulSet's): served once its volume is.
    again = PodRef(POD_A.namespace, POD_A.name, POD_A.uid.replace("a", "c"), power_cap=True)
    (tmp_path / "vol2").mkdir()
    node.publish(tmp_path / "vol2", again)
    assert node.agent.answer(again, CAP) == {"watts": 150.0}
    node.stop()


def test_a_cap_racing_the_agents_stop_is_put_back_or_refused(tmp_path: Path) -> None:
    board, node = _node(tmp_path)
    (tmp_path / "vol").mkdir()
    node.publish(tmp_path / "vol", POD_A)
    answers: dict[int, dict] = {}

    def ask(i: int) -> None:
        answers[i] = node.agent.answer(POD_A, CAP)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(20)]
    for t in threads[:10]:   # in flight while the agent stops
        t.start()
    node.stop()
    for t in threads[10:]:
        t.start()
    for t in threads:
        t.join()
    assert board.limits == [TDP_WATTS] and node.keeper.caps == {}
    assert all("stopping" in answers[i]["error"] for i in range(10, 20)), answers


def test_an_unreadable_volumes_file_is_set_aside_not_a_crash_at_every_start(
        tmp_path: Path, caplog) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "volumes.json").write_text("")   # a crash before the rename
    _, node = _node(tmp_path)
    with caplog.at_level(logging.ERROR):
        node.resume()
    assert node.listeners == {}
    assert (tmp_path / "state" / "volumes.bad").read_text() == ""
    assert not (tmp_path / "state" / "volumes.json").exists()
    assert len([r for r in caplog.records if "volumes.json unreadable" in r.message]) == 1
    node.resume()   # and the next start finds nothing to trip on
