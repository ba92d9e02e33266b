#!/usr/bin/env python3
"""A lab of hosts in network namespaces, each with its own sshd, for the multinode scenario.

Why namespaces: the two-host PD topology needs hosts that are really apart on the network
(their own addresses, their own loopback, their own listening ports) and are reached by Ansible
over real SSH, on a CI machine without Docker. Each host is a network namespace with one veth
onto a bridge in the root namespace, an address in one private /24 and an sshd that accepts only
the lab's generated ed25519 key. The namespaces have no default route, so nothing a host runs can
send traffic anywhere but the lab's /24.

Every name the lab creates carries its prefix (``--name``), and ``down`` finds what to remove by
that prefix and by namespace membership, not only from the record ``up`` writes: it cleans up
after a failed or interrupted run, and does nothing when nothing exists.

    netns_lab.py up   --name pdmn --subnet 10.254.77 --dir DIR --host mn-router=10 ...
    netns_lab.py down --name pdmn --dir DIR
    netns_lab.py status --name pdmn --dir DIR
    netns_lab.py cut  --name pdmn --dir DIR --host mn-decode   # the host "goes away"

Each command prints one JSON object (``changed`` says whether anything was done).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
HOST_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
SUBNET_RE = re.compile(r"^(10|172|192)\.\d{1,3}\.\d{1,3}$")
BRIDGE_OCTET = 1
# Written first into a lab directory; `down` removes only directories that carry it.
MARKER = ".netns-lab"


class LabError(RuntimeError):
    """A lab step failed; the message says which and how to fix it."""


@dataclass
class LabHost:
    """One host of the lab: inventory name, namespace, veth (root side) and address."""

    name: str
    namespace: str
    veth: str
    address: str
    host_key_pub: str = ""


def run(*argv: str, check: bool = True, netns: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command (inside `netns` when given) and return it; raise LabError naming it on failure."""
    cmd = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        detail = proc.stderr.strip() or proc.stdout.strip()
        raise LabError(f"{' '.join(cmd)} failed (rc={proc.returncode}): {detail}")
    return proc


def lab_hosts(name: str, subnet: str, specs: list[str]) -> list[LabHost]:
    """Parse --host NAME=OCTET specs into LabHosts with derived namespace and veth names."""
    hosts = []
    for spec in specs:
        host, _, octet = spec.partition("=")
        if not HOST_RE.match(host) or not octet.isdigit() or not 2 <= int(octet) <= 254:
            raise LabError(f"--host {spec!r}: expected NAME=OCTET with a lower-case NAME and OCTET in 2..254")
        number = int(octet)
        hosts.append(LabHost(host, f"{name}-{host}", f"{name}-{number}", f"{subnet}.{number}"))
    if len({h.address for h in hosts}) != len(hosts) or len({h.name for h in hosts}) != len(hosts):
        raise LabError("--host: every host needs its own NAME and OCTET")
    return hosts


def bridge_name(name: str) -> str:
    return f"{name}-br"


def namespaces_with_prefix(name: str) -> list[str]:
    out = run("ip", "netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.split()]
    return [ns for ns in names if ns.startswith(f"{name}-")]


def links_with_prefix(name: str) -> list[str]:
    out = run("ip", "-o", "link", "show", check=False).stdout
    links = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1:
            link = parts[1].strip().split("@")[0]
            if link.startswith(f"{name}-"):
                links.append(link)
    return links


def namespace_pids(namespace: str) -> list[int]:
    out = run("ip", "netns", "pids", namespace, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_namespace(namespace: str, grace_s: float = 5.0) -> int:
    """Stop every process living in `namespace` (TERM, then KILL after grace_s); return how many."""
    pids = namespace_pids(namespace)
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while namespace_pids(namespace) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in namespace_pids(namespace):
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while namespace_pids(namespace) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = namespace_pids(namespace)
    if left:
        raise LabError(f"processes {left} in namespace {namespace} survived SIGKILL")
    return len(pids)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def stop_control_masters(lab_dir: Path) -> int:
    """Ask every OpenSSH control master whose socket lives in the lab to exit (Ansible leaves them)."""
    cp_dir = lab_dir / "ssh" / "cp"
    count = 0
    if cp_dir.is_dir():
        for sock in cp_dir.iterdir():
            run("ssh", "-o", f"ControlPath={sock}", "-O", "exit", "lab", check=False)
            sock.unlink(missing_ok=True)
            count += 1
    return count


def subnet_in_use(subnet: str) -> str | None:
    """The interface already holding an address in subnet.0/24, if any."""
    out = run("ip", "-o", "-4", "addr", "show", check=False).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].startswith(f"{subnet}."):
            return fields[1]
    return None


def sshd_config(host: LabHost, host_dir: Path, ssh_dir: Path) -> str:
    return "\n".join(
        [
            f"# sshd of lab host {host.name} (namespace {host.namespace}); written by netns_lab.py",
            f"ListenAddress {host.address}:22",
            f"HostKey {host_dir / 'ssh_host_ed25519_key'}",
            f"PidFile {host_dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {ssh_dir / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            # The key lives in the checkout, which may sit under /tmp (CI clones there): StrictModes
            # rejects any key below a world-writable directory. The sshd listens on its namespace
            # address only, and the directory holding the key is 0700.
            "StrictModes no",
            "PrintMotd no",
            "AllowTcpForwarding no",
            "X11Forwarding no",
            "MaxStartups 64:30:128",
            "MaxSessions 64",
            "LogLevel VERBOSE",
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


def disable_ipv6(link: str) -> None:
    """No IPv6 on a root-namespace link of the lab, so it carries only the lab's IPv4 /24."""
    Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6").write_text("1\n")


def stray_processes(name: str, lab_dir: Path) -> list[dict[str, Any]]:
    """Processes that run something of the lab's hosts but live outside every lab namespace.

    Everything the converge starts runs over SSH inside a host's namespace; a process whose command
    line names a host's directory but whose network namespace is the root one would be serving on
    this machine's own addresses. SSH clients (Ansible's control masters) and this helper's own
    ancestry are the controller's side and are left out.
    """
    lab_inodes = {_netns_inode(Path("/run/netns") / ns) for ns in namespaces_with_prefix(name)}
    hosts_dir = f"{lab_dir}/hosts/"
    ours = _ancestors(os.getpid())
    strays = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in ours:
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            exe = os.readlink(proc / "exe")
            inode = _netns_inode(proc / "ns" / "net")
        except OSError:
            continue
        if hosts_dir in cmdline and inode not in lab_inodes and Path(exe).name != "ssh":
            strays.append({"pid": int(proc.name), "cmdline": cmdline[:200]})
    return strays


def _netns_inode(path: Path) -> int:
    return path.stat().st_ino


def _ancestors(pid: int) -> set[int]:
    seen = {pid}
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        seen.add(pid)
    return seen


def keygen(path: Path, comment: str) -> str:
    """Generate an ed25519 key pair at path (no passphrase); return the public key line."""
    run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path))
    return Path(f"{path}.pub").read_text().strip()


def wait_for_ssh(address: str, timeout_s: float = 10.0) -> None:
    """Wait until an SSH banner comes back from address:22."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, 22), timeout=1.0) as sock:
                if sock.recv(64).startswith(b"SSH-"):
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise LabError(f"sshd on {address}:22 did not answer within {timeout_s:.0f} s ({last})")


def sshd_running(host: LabHost, host_dir: Path) -> bool:
    pid_file = host_dir / "sshd.pid"
    if not pid_file.is_file():
        return False
    pid = pid_file.read_text().strip()
    return pid.isdigit() and int(pid) in namespace_pids(host.namespace)


def healthy(name: str, subnet: str, hosts: list[LabHost], lab_dir: Path) -> bool:
    """The recorded lab matches the request and every host's namespace and sshd are up."""
    record = lab_dir / "lab.json"
    if not record.is_file():
        return False
    state = json.loads(record.read_text())
    wanted = [(h.name, h.address) for h in hosts]
    if state.get("name") != name or state.get("subnet") != subnet:
        return False
    if [(h["name"], h["address"]) for h in state.get("hosts", [])] != wanted:
        return False
    existing = set(namespaces_with_prefix(name))
    return all(h.namespace in existing and sshd_running(h, lab_dir / "hosts" / h.name) for h in hosts)


def up(name: str, subnet: str, hosts: list[LabHost], lab_dir: Path) -> dict[str, Any]:
    """Create the lab (or leave a healthy one alone) and return its description."""
    if healthy(name, subnet, hosts, lab_dir):
        state = json.loads((lab_dir / "lab.json").read_text())
        return {"changed": False, **state}
    down(name, lab_dir)
    try:
        return _create(name, subnet, hosts, lab_dir)
    except Exception:
        down(name, lab_dir)  # leave nothing half-made behind
        raise


def _create(name: str, subnet: str, hosts: list[LabHost], lab_dir: Path) -> dict[str, Any]:
    if not Path(SSHD).is_file():
        raise LabError(
            f"{SSHD} is missing: install Debian's OpenSSH server first "
            "(apt-get update && apt-get install -y --no-install-recommends openssh-server)"
        )
    holder = subnet_in_use(subnet)
    if holder:
        raise LabError(f"{subnet}.0/24 is already on interface {holder}; pick another --subnet or remove it")

    lab_dir.mkdir(parents=True, mode=0o700)
    (lab_dir / MARKER).write_text(f"netns lab {name}: removed by `netns_lab.py down`\n")
    ssh_dir = lab_dir / "ssh"
    (ssh_dir / "cp").mkdir(parents=True, mode=0o700)
    ssh_dir.chmod(0o700)
    client_pub = keygen(ssh_dir / "id_ed25519", f"pd-lab-{name}")
    (ssh_dir / "authorized_keys").write_text(client_pub + "\n")
    (ssh_dir / "authorized_keys").chmod(0o600)
    privsep_created = not PRIVSEP_DIR.exists()
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)

    bridge = bridge_name(name)
    run("ip", "link", "add", bridge, "type", "bridge")
    disable_ipv6(bridge)
    run("ip", "addr", "add", f"{subnet}.{BRIDGE_OCTET}/24", "dev", bridge)
    run("ip", "link", "set", bridge, "up")
    known_hosts = []
    for host in hosts:
        host_dir = lab_dir / "hosts" / host.name
        host_dir.mkdir(parents=True, mode=0o700)
        run("ip", "netns", "add", host.namespace)
        # IPv4 on the lab's /24 only: no IPv6 (not even link-local) inside the namespace.
        run("sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
            netns=host.namespace)  # fmt: skip
        run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", f"{host.veth}p")
        disable_ipv6(host.veth)
        run("ip", "link", "set", f"{host.veth}p", "netns", host.namespace)
        run("ip", "link", "set", host.veth, "master", bridge)
        run("ip", "link", "set", host.veth, "up")
        run("ip", "link", "set", f"{host.veth}p", "name", "eth0", netns=host.namespace)
        run("ip", "addr", "add", f"{host.address}/24", "dev", "eth0", netns=host.namespace)
        run("ip", "link", "set", "lo", "up", netns=host.namespace)
        run("ip", "link", "set", "eth0", "up", netns=host.namespace)
        host.host_key_pub = keygen(host_dir / "ssh_host_ed25519_key", f"{host.name}-host-key")
        config = host_dir / "sshd_config"
        config.write_text(sshd_config(host, host_dir, ssh_dir))
        run(SSHD, "-t", "-f", str(config), netns=host.namespace)
        run(SSHD, "-f", str(config), "-E", str(host_dir / "sshd.log"), netns=host.namespace)
        known_hosts.append(f"{host.address} {' '.join(host.host_key_pub.split()[:2])}")
    (ssh_dir / "known_hosts").write_text("\n".join(known_hosts) + "\n")
    for host in hosts:
        wait_for_ssh(host.address)
    state = {
        "name": name,
        "subnet": subnet,
        "bridge": bridge,
        "bridge_address": f"{subnet}.{BRIDGE_OCTET}",
        "dir": str(lab_dir),
        "private_key": str(ssh_dir / "id_ed25519"),
        "known_hosts": str(ssh_dir / "known_hosts"),
        "control_path_dir": str(ssh_dir / "cp"),
        "privsep_dir_created": privsep_created,
        "hosts": [asdict(h) for h in hosts],
    }
    (lab_dir / "lab.json").write_text(json.dumps(state, indent=2) + "\n")
    return {"changed": True, **state}


def down(name: str, lab_dir: Path) -> dict[str, Any]:
    """Remove every process, namespace, link and file of lab `name`; a no-op when none exists."""
    record = lab_dir / "lab.json"
    state = json.loads(record.read_text()) if record.is_file() else {}
    removed: dict[str, Any] = {"processes": 0, "namespaces": [], "links": [], "control_masters": 0}
    removed["control_masters"] = stop_control_masters(lab_dir)
    for namespace in namespaces_with_prefix(name):
        removed["processes"] += kill_namespace(namespace)
        run("ip", "netns", "del", namespace)
        removed["namespaces"].append(namespace)
    for link in links_with_prefix(name):
        run("ip", "link", "del", link, check=False)
        removed["links"].append(link)
    removed["dir"] = False
    if lab_dir.exists() and not (lab_dir / MARKER).is_file():
        raise LabError(f"{lab_dir} exists but is not a lab directory (no {MARKER}); remove it yourself")
    if lab_dir.exists():
        shutil.rmtree(lab_dir)
        removed["dir"] = True
    privsep_unused = PRIVSEP_DIR.is_dir() and not any(PRIVSEP_DIR.iterdir()) and not _any_sshd_running()
    if state.get("privsep_dir_created") and privsep_unused:
        PRIVSEP_DIR.rmdir()
        removed["privsep_dir"] = str(PRIVSEP_DIR)
    return {"changed": any(bool(v) for v in removed.values()), "removed": removed}


def _any_sshd_running() -> bool:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.readlink(proc / "exe") == SSHD:
                    return True
            except OSError:
                continue
    return False


def status(name: str, lab_dir: Path) -> dict[str, Any]:
    """What exists now: namespaces, links, the processes in each namespace, the lab directory."""
    return {
        "changed": False,
        "namespaces": {ns: namespace_pids(ns) for ns in namespaces_with_prefix(name)},
        "links": links_with_prefix(name),
        "dir_exists": lab_dir.exists(),
        "stray_processes": stray_processes(name, lab_dir),
    }


def cut(name: str, lab_dir: Path, host_name: str) -> dict[str, Any]:
    """Make a host go away: its link to the bridge goes down and its sshd stops, mid-run."""
    state = json.loads((lab_dir / "lab.json").read_text())
    matches = [h for h in state["hosts"] if h["name"] == host_name]
    if not matches:
        raise LabError(f"no host {host_name!r} in lab {name}; hosts: {[h['name'] for h in state['hosts']]}")
    host = matches[0]
    run("ip", "link", "set", host["veth"], "down")
    pid_file = lab_dir / "hosts" / host_name / "sshd.pid"
    if pid_file.is_file():
        _signal(int(pid_file.read_text().strip()), signal.SIGTERM)
    # Ansible's persistent connections would otherwise hang on the dead link instead of failing:
    # drop them all (between plays nothing is in flight; the live hosts reconnect at once).
    masters = stop_control_masters(lab_dir)
    return {"changed": True, "host": host_name, "veth": host["veth"], "control_masters_stopped": masters}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status", "cut"])
    parser.add_argument("--name", required=True, help="prefix of every namespace and link (1-8 of a-z0-9)")
    parser.add_argument("--dir", required=True, type=Path, help="the lab's directory (keys, configs, record)")
    parser.add_argument("--subnet", default="10.254.77", help="first three octets of the lab's private /24")
    parser.add_argument("--host", action="append", default=[], help="NAME=OCTET (up); NAME (cut)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if os.geteuid() != 0:
            raise LabError("the lab needs root (ip netns, veth, bridge, sshd); run it as root")
        if not NAME_RE.match(args.name):
            raise LabError(f"--name {args.name!r}: use 1-8 lower-case letters/digits, starting with a letter")
        lab_dir = args.dir.resolve()
        if args.command == "up":
            if not SUBNET_RE.match(args.subnet):
                raise LabError(
                    f"--subnet {args.subnet!r}: give the first three octets of a private /24 (10.254.77)"
                )
            result = up(args.name, args.subnet, lab_hosts(args.name, args.subnet, args.host), lab_dir)
        elif args.command == "down":
            result = down(args.name, lab_dir)
        elif args.command == "status":
            result = status(args.name, lab_dir)
        else:
            if len(args.host) != 1:
                raise LabError("cut needs exactly one --host NAME")
            result = cut(args.name, lab_dir, args.host[0])
    except LabError as exc:
        print(json.dumps({"changed": False, "failed": True, "msg": str(exc)}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
