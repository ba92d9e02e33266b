#!/usr/bin/env bash
# The Debian/Ubuntu packages `make test` needs, installed when run as root with apt, else checked and
# named: a fresh machine either gets them or is told exactly what to install. Then dockerd is started
# when it is installed but not running (the molecule scenarios' hosts are local containers).
#   scripts/system-packages.sh            # install (root) or check (anyone)
#   scripts/system-packages.sh --check    # check only
set -euo pipefail

# package -> why the tests need it
declare -A NEEDED=(
  [python3]="Debian's python3: the rehearsal host runs Ansible's modules with it, as a Debian 12 lab host does"
  [patch]="GNU patch: the SGLang patch series check"
  [openssh-client]="ssh: the molecule scenarios reach their container hosts over SSH"
  [dpkg-dev]="dpkg-scanpackages: the stand-in apt repository (molecule/driver)"
  [gnupg]="gpg: signs the stand-in apt repository"
  [iproute2]="ss and ip: preflight's port checks, the container networks"
  [procps]="ps and pgrep: preflight's process checks, destroy steps"
  [numactl]="numactl: the rehearsal's workers start under the rendered NUMA binding (node 0 on a one-node machine)"
  [docker.io]="Docker: the molecule scenarios' fresh lab hosts"
  [debootstrap]="debootstrap: builds the lab host image locally (no registry)"
  [prometheus]="Prometheus and promtool: the monitor stage, its rule tests and the rehearsal it scrapes"
  [prometheus-node-exporter]="the node exporter the monitor stage runs"
)

missing=()
for pkg in "${!NEEDED[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done

if ((${#missing[@]})); then
  if [[ ${1:-} != --check && $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "== installing system packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "Missing system packages (make test needs them):" >&2
    for pkg in "${missing[@]}"; do echo "  $pkg: ${NEEDED[$pkg]}" >&2; done
    echo "Install them: sudo apt-get install --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
fi

# dockerd: start it when it is installed but not answering (CI machines have no init for it).
if command -v dockerd >/dev/null && ! docker info >/dev/null 2>&1; then
  if [[ ${1:-} == --check || $(id -u) != 0 ]]; then
    echo "dockerd is not running: start it (sudo systemctl start docker, or sudo dockerd &)" >&2
    exit 1
  fi
  echo "== starting dockerd"
  mkdir -p /var/log
  nohup dockerd >/var/log/pd-appliance-dockerd.log 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/pd-appliance-dockerd.log" >&2; exit 1; }
fi
