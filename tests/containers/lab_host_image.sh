#!/usr/bin/env bash
# Build the lab host image the container scenarios run on: a bare Debian 12 server with systemd as
# PID 1 and sshd, built locally (debootstrap | docker import; nothing is pulled from a registry).
#
#   tests/containers/lab_host_image.sh          # prints the image reference, e.g. pdlab-host:3f2a9c1d0b7e
#   tests/containers/lab_host_image.sh --check  # prints it only if it is built (exit 1 otherwise)
#
# The tag is a hash of the image's inputs: the package list and suite below, the CA bundle the
# image trusts and this script itself. An image with that tag is reused as is (the build takes
# about a minute); a change of any input builds a new one and removes the older pdlab-host images
# no container uses. The image stays in Docker's store as a cache: `docker rmi pdlab-host:<tag>`.
#
# What a bare lab server has, and nothing the appliance must install itself (python3-venv,
# numactl, the service user, supervisord, its systemd unit: provision's job, and the point of
# running it here). The host's CA bundle plays the part of a lab's own CA setup: the certificates
# it holds beyond Debian's are added to the image's trust store, and pip is told to use that store.
set -euo pipefail

SUITE=bookworm
MIRROR=${PDLAB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=systemd,systemd-sysv,dbus,python3,openssh-server,iproute2,sudo,ca-certificates
CA_BUNDLE=${PDLAB_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
REPO=pdlab-host
# The login Ansible uses, with passwordless sudo, as inventory/lab/hosts.yml asks of a lab host
# ("admin" is the default user of Debian's own cloud images).
ADMIN_USER=admin

die() {
  echo "lab_host_image.sh: $*" >&2
  exit 1
}

inputs_hash() {
  {
    echo "$SUITE $MIRROR $PACKAGES $ADMIN_USER"
    sha256sum <"$CA_BUNDLE"
    sha256sum <"${BASH_SOURCE[0]}"
  } | sha256sum | cut -c1-12
}

[ -r "$CA_BUNDLE" ] || die "CA bundle $CA_BUNDLE is not readable; set PDLAB_CA_BUNDLE to the bundle the hosts must trust"
command -v docker >/dev/null || die "docker is missing: apt-get install -y docker.io (and start dockerd)"
docker info >/dev/null 2>&1 || die "dockerd does not answer: start it (dockerd &, or systemctl start docker)"
TAG="$REPO:$(inputs_hash)"

# One build at a time: scenarios and tests that start together wait for the first build and reuse it.
exec 9>"${TMPDIR:-/tmp}/pdlab-host-image.lock"
flock 9

if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "$TAG"
  exit 0
fi
[ "${1:-}" = --check ] && exit 1

[ "$(id -u)" = 0 ] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install -y debootstrap"

WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/pdlab-host.XXXXXX")
trap 'rm -rf --one-file-system "$WORK"' EXIT
ROOTFS="$WORK/rootfs"
start=$(date +%s)
echo "building $TAG (debootstrap $SUITE minbase: $PACKAGES)" >&2
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
  { tail -n 30 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log above)"; }

# The lab's CA: the certificates of the host's bundle that Debian's does not hold, installed the way
# an administrator adds a site CA, and pip pointed at the system store (pip ships its own otherwise).
python3 - "$CA_BUNDLE" "$ROOTFS/etc/ssl/certs/ca-certificates.crt" "$ROOTFS/usr/local/share/ca-certificates" <<'EOF'
import re, sys
from pathlib import Path
pem = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)
def certs(path): return pem.findall(Path(path).read_text())
known = set(certs(sys.argv[2]))
extra = [c for c in certs(sys.argv[1]) if c not in known]
for i, cert in enumerate(extra):
    Path(sys.argv[3], f"pdlab-site-ca-{i}.crt").write_text(cert + "\n")
print(f"{len(extra)} site CA certificate(s) added", file=sys.stderr)
EOF
chroot "$ROOTFS" update-ca-certificates >/dev/null 2>&1
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$ROOTFS/etc/pip.conf"

# Debian's updates and security suites, as on an installed server.
cat >"$ROOTFS/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
EOF

# The admin login: key-only SSH (create.yml installs the key), passwordless sudo.
chroot "$ROOTFS" useradd --create-home --shell /bin/bash --groups sudo "$ADMIN_USER"
echo "$ADMIN_USER ALL=(ALL) NOPASSWD: ALL" >"$ROOTFS/etc/sudoers.d/90-$ADMIN_USER"
chmod 0440 "$ROOTFS/etc/sudoers.d/90-$ADMIN_USER"
cat >"$ROOTFS/etc/ssh/sshd_config.d/pdlab.conf" <<'EOF'
# Keys only, as on a lab server.
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
EOF

# docker import takes no STOPSIGNAL: create.yml runs the containers with --stop-signal=SIGRTMIN+3
# (systemd's halt; SIGTERM only makes it re-execute itself).
# Every container gets its own host keys and machine id at first boot, not the image's.
rm -f "$ROOTFS"/etc/ssh/ssh_host_*
mkdir -p "$ROOTFS/etc/systemd/system/ssh.service.d"
cat >"$ROOTFS/etc/systemd/system/ssh.service.d/pdlab-host-keys.conf" <<'EOF'
[Service]
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
EOF
: >"$ROOTFS/etc/machine-id"
rm -f "$ROOTFS/var/lib/dbus/machine-id"
# Consoles do not exist in a container; their gettys would only fail.
chroot "$ROOTFS" systemctl mask getty.target console-getty.service >/dev/null 2>&1
chroot "$ROOTFS" systemctl enable ssh.service >/dev/null 2>&1
chroot "$ROOTFS" apt-get clean

tar --numeric-owner -C "$ROOTFS" -c . |
  docker import \
    --change 'CMD ["/lib/systemd/systemd"]' \
    --change 'ENV container=docker' \
    --change "LABEL pdlab.inputs=${TAG#*:} pdlab.admin_user=$ADMIN_USER" \
    - "$TAG" >/dev/null

# Older builds of this image that no container uses are dropped; the current one stays cached.
for old in $(docker image ls --format '{{.Repository}}:{{.Tag}}' "$REPO"); do
  [ "$old" = "$TAG" ] || docker image rm "$old" >/dev/null 2>&1 || true
done
echo "built $TAG in $(($(date +%s) - start)) s" >&2
echo "$TAG"
