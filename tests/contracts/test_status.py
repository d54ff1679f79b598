"""The contracts between the parts: typed choices and the /status document."""

from __future__ import annotations

import json
import math

import pytest

from throttledjob.contracts.policy import Enforcement, Mode, Policy, parse_policy
from throttledjob.contracts.status import (
    OBSERVED,
    OBSERVED_NAMES,
    STATUS_VERSION,
    observed_document,
    parse_status,
)


@pytest.mark.parametrize("written, signals, pacing", [
    ("Cooperative", False, True), ("signals", True, False), ("BOTH", True, True)])
def test_enforcement_is_typed_and_says_which_levers_it_uses(written, signals, pacing):
    p = parse_policy({"enforcement": written, "mode": "Fixed"})
    assert isinstance(p.enforcement, Enforcement) and p.enforcement == written.lower()
    assert (p.uses_signals, p.uses_pacing, p.adaptive) == (signals, pacing, False)
    assert p.mode is Mode.FIXED and str(p.mode) == "fixed"


def test_a_plain_string_override_is_stored_as_the_enum():
    p = Policy().with_overrides(enforcement="signals")
    assert p.enforcement is Enforcement.SIGNALS and p.uses_signals and not p.uses_pacing


def test_the_sidecars_status_document_reads_back_unchanged():
    import os
    import tempfile

    from throttledjob.contracts.policy import Policy
    from throttledjob.sidecar.agent import Agent
    from throttledjob.sidecar.cpu.processes import ProcessTree
    from throttledjob.sidecar.snapshot import Health, snapshot_of, status_document

    with tempfile.TemporaryDirectory() as d:
        agent = Agent(Policy(cpu_peak_cores=1.0), ProcessTree(root_pid=os.getpid()), d, None)
        doc = json.loads(json.dumps(status_document(snapshot_of(agent.result, Health()))))
    assert doc["version"] == STATUS_VERSION
    assert parse_status(doc) == doc
    assert doc["targets"]["enforcement"] == "quota" and doc["targets"]["mode"] == "adaptive"


def test_status_numbers_that_are_not_finite_become_none_and_flags_must_be_true():
    doc = parse_status({"observed": {"cpuPeakCores": math.nan, "slowdown": "2",
                                     "throttleLevel": 0.5},
                        "targetMet": "yes", "errors": "x"})
    assert doc["version"] == 1  # before the field existed
    assert doc["observed"]["cpuPeakCores"] is None and doc["observed"]["slowdown"] is None
    assert doc["observed"]["throttleLevel"] == 0.5
    assert doc["targetMet"] is False and doc["errors"] == []
    # null is the sidecar's "not measured yet"; a missing verdict is no verdict of met.
    assert parse_status({"observed": {}, "targetMet": None})["targetMet"] is None
    assert parse_status({"observed": {}})["targetMet"] is False


@pytest.mark.parametrize("doc, message", [
    ([], "no 'observed' object"), ({"observed": 1}, "no 'observed' object"),
    ({"version": 2, "observed": {}}, "status version 2, this operator reads 1")])
def test_unusable_status_documents_are_refused_by_name(doc, message):
    with pytest.raises(ValueError, match=message):
        parse_status(doc)


def test_the_sidecars_observed_is_the_table_field_for_field():
    import os
    import tempfile

    from throttledjob.sidecar.agent import Agent
    from throttledjob.sidecar.cpu.processes import ProcessTree
    from throttledjob.sidecar.snapshot import Health, snapshot_of, status_document

    with tempfile.TemporaryDirectory() as d:
        agent = Agent(Policy(cpu_peak_cores=1.0), ProcessTree(root_pid=os.getpid()), d, None)
        observed = status_document(snapshot_of(agent.result, Health()))["observed"]
    assert tuple(observed) == OBSERVED_NAMES
    for f in OBSERVED:
        value = observed[f.name]
        if value is None:
            assert f.nullable, f.name
        elif f.type == "integer":
            assert isinstance(value, int) and not isinstance(value, bool), f.name
        else:
            assert isinstance(value, (int, float)) and not isinstance(value, bool), f.name


def test_an_observed_document_must_name_exactly_the_tables_fields():
    full = dict.fromkeys(OBSERVED_NAMES, 1)
    assert list(observed_document(dict(reversed(full.items())))) == list(OBSERVED_NAMES)
    with pytest.raises(ValueError, match=r"\['steps'\] missing"):
        observed_document({k: v for k, v in full.items() if k != "steps"})
    with pytest.raises(ValueError, match=r"\['cpuMinCores'\] not in"):
        observed_document({**full, "cpuMinCores": 0.1})


def test_every_observed_number_that_is_not_finite_becomes_none():
    numbers = [f.name for f in OBSERVED if f.type == "number"]
    doc = parse_status({"observed": dict.fromkeys(numbers, math.inf)})
    assert doc["observed"] == dict.fromkeys(numbers)
