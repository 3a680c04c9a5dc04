#!/usr/bin/env bash
# Shared by deploy/podman/*.sh (sourced): podman set up the way it runs on these
# machines, and the local base images that stand in for registry ones.
#
# podman (Debian's 4.3) runs containers here with runc (crun fails on this kernel's mixed
# cgroup setup) and only when the default ulimits are within the machine's hard limits:
# a containers.conf of our own says both, pointed to by CONTAINERS_CONF, so nothing of
# the machine's own configuration is changed.

# podman_install: installs podman, runc, debootstrap and catatonit (the init of the pause
# container `podman kube play` builds; a package podman only recommends) from Debian's
# archive when one is missing and this is a Debian machine run as root; quiet when all
# are there. Fails (returning the reason on stdout) only when it cannot install them.
podman_install() {
  local missing=() tool
  for tool in podman runc debootstrap catatonit; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] \
      || [ -x "/usr/libexec/podman/$tool" ] || missing+=("$tool")
  done
  [ "${#missing[@]}" = 0 ] && return 0
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    || { echo "${missing[*]} not installed, and no apt-get as root to install them"; return 1; }
  echo "apt-get install ${missing[*]}" >&2
  local lock=(-o DPkg::Lock::Timeout=300)
  if ! { DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" install -y -qq \
      --no-install-recommends "${missing[@]}" netavark aardvark-dns; } >/dev/null 2>&1; then
    echo "apt-get install ${missing[*]} failed"
    return 1
  fi
}

# podman_ready: podman and runc are installed and podman answers; otherwise the
# reason, on stdout, for the caller's SKIP line. (Whether a container can run is
# known only once there is an image: podman_runs.)
podman_ready() {
  local tool
  for tool in podman runc; do
    command -v "$tool" >/dev/null 2>&1 || { echo "$tool is not installed (apt-get install podman runc)"; return 1; }
  done
  [ "$(id -u)" = 0 ] || { echo "not root: these scripts use rootful podman"; return 1; }
  podman info >/dev/null 2>&1 || { echo "podman info fails: $(podman info 2>&1 | tail -n 1)"; return 1; }
  return 0
}

# podman_runs IMAGE: a container of IMAGE runs `true`; otherwise podman's last word on
# stdout (no user namespaces, no cgroups, a runtime that fails on this kernel...).
podman_runs() {
  local out
  out=$(podman run --rm --pull never --network none "$1" true 2>&1) && return 0
  echo "podman cannot run a container here: $(tail -n 1 <<<"$out")"
  return 1
}

# podman_conf DIR: writes DIR/containers.conf and exports CONTAINERS_CONF.
podman_conf() {
  cat >"$1/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
events_logger = "file"
[network]
# netavark, Debian's podman default, whatever CNI files the machine has lying around.
network_backend = "netavark"
CONF
  export CONTAINERS_CONF="$1/containers.conf"
}

# The local bases, named after what they stand in for.
DEBIAN_BASE=localhost/tollgate-debian:bookworm
RUNTIME_BASE=localhost/tollgate-runtime-base:bookworm
# The play test's apps' base: the Debian base with redis-server (deploy/podman/play.sh).
PLAY_BASE=localhost/tollgate-play-base:bookworm

# An imported image has no environment: PATH as Debian's images set it.
IMAGE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

have_image() { podman image exists "$1"; }

# debian_base WORK: a Debian bookworm (minbase, with CA certificates, iptables, curl and
# python3) made with debootstrap from Debian's package archive and imported, unless
# already there. It is the build stages' base, the iptables image's, and the play test's
# app image.
debian_base() {
  have_image "$DEBIAN_BASE" && return 0
  command -v debootstrap >/dev/null 2>&1 || { echo "debootstrap is not installed" >&2; return 1; }
  local root=$1/rootfs
  debootstrap --variant=minbase --include=ca-certificates,iptables,curl,python3 \
    bookworm "$root" >"$1/debootstrap.log" 2>&1 || { tail -n 20 "$1/debootstrap.log" >&2; return 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import --quiet --change "ENV PATH=$IMAGE_PATH" --change 'CMD ["/bin/bash"]' - "$DEBIAN_BASE" >/dev/null
  rm -rf "$root"
}

# runtime_base WORK BINARY: what distroless cc-debian12:nonroot gives the image, taken
# from the Debian base: the shared libraries BINARY and `sleep` load (glibc, libgcc),
# CA certificates, and the user and group 65532 (nonroot); nothing else, no shell.
runtime_base() {
  have_image "$RUNTIME_BASE" && return 0
  local root=$1/runtime-root
  mkdir -p "$root"/etc/ssl/certs "$root"/tmp "$root"/home/nonroot
  chmod 1777 "$root"/tmp
  # The libraries, as the Debian base resolves them (its loader, its paths).
  local cid
  cid=$(podman create "$DEBIAN_BASE" /bin/true)
  podman cp "$2" "$cid":/tmp/tollgate
  local mnt
  mnt=$(podman mount "$cid")
  local libs
  libs=$(chroot "$mnt" /bin/sh -c 'ldd /tmp/tollgate /bin/sleep' | awk '/=>/ {print $3} /^\t\// {print $1}' | sort -u)
  local lib
  for lib in $libs; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$mnt$lib" "$root$lib"
  done
  cp -L "$mnt"/etc/ssl/certs/ca-certificates.crt "$root"/etc/ssl/certs/
  podman umount "$cid" >/dev/null
  podman rm "$cid" >/dev/null
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root"/etc/passwd
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root"/etc/group
  chown 65532:65532 "$root"/home/nonroot
  tar -C "$root" -c . | podman import --quiet --change "ENV PATH=$IMAGE_PATH" --change 'USER 65532:65532' - "$RUNTIME_BASE" >/dev/null
  rm -rf "$root"
}
