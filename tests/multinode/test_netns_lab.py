"""The lab helper's decisions that need no namespace: host specs, and what `down` refuses to remove."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import netns_lab


def test_host_specs_become_namespaces_veths_and_addresses() -> None:
    hosts = netns_lab.lab_hosts("pdmn", "10.254.77", ["mn-router=10", "mn-decode=12"])
    assert [(h.name, h.namespace, h.veth, h.address) for h in hosts] == [
        ("mn-router", "pdmn-mn-router", "pdmn-10", "10.254.77.10"),
        ("mn-decode", "pdmn-mn-decode", "pdmn-12", "10.254.77.12"),
    ]
    # Linux caps interface names at 15 characters: the veth name must fit for any valid host.
    assert all(len(h.veth) <= 15 for h in netns_lab.lab_hosts("abcdefgh", "10.254.77", ["x=254"]))


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["mn-router"], "expected NAME=OCTET"),
        (["mn-router=1"], "OCTET in 2..254"),
        (["Router=10"], "lower-case NAME"),
        (["a=10", "b=10"], "its own NAME and OCTET"),
        (["a=10", "a=11"], "its own NAME and OCTET"),
    ],
)
def test_bad_host_specs_are_refused_with_the_fix(specs: list[str], message: str) -> None:
    with pytest.raises(netns_lab.LabError, match=message):
        netns_lab.lab_hosts("pdmn", "10.254.77", specs)


def test_down_never_removes_a_directory_it_did_not_make(tmp_path: Path) -> None:
    precious = tmp_path / "not-a-lab"
    precious.mkdir()
    (precious / "data").write_text("keep me")
    with pytest.raises(netns_lab.LabError, match="not a lab directory"):
        netns_lab.down("pdzz", precious)
    assert (precious / "data").read_text() == "keep me"


def test_down_of_nothing_changes_nothing(tmp_path: Path) -> None:
    result = netns_lab.down("pdzz", tmp_path / "absent")
    assert result["changed"] is False
    assert result["removed"]["namespaces"] == [] and result["removed"]["links"] == []


def test_cli_refuses_a_bad_name_and_subnet(capsys: pytest.CaptureFixture[str]) -> None:
    if not hasattr(netns_lab.os, "geteuid") or netns_lab.os.geteuid() != 0:
        pytest.skip("the CLI checks root first")
    assert netns_lab.main(["up", "--name", "Bad-Name", "--dir", "/nonexistent"]) == 1
    assert "use 1-8 lower-case letters" in capsys.readouterr().out
    assert netns_lab.main(["up", "--name", "pdzz", "--dir", "/nonexistent", "--subnet", "8.8.8"]) == 1
    assert "private /24" in capsys.readouterr().out
