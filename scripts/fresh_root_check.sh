#!/usr/bin/env bash
# Proves the README's two commands on a fresh machine: builds a minimal Debian 12 (bookworm) root with
# mmdebstrap from Debian's mirror (variant minbase, plus sudo), copies a clean `git clone` of this
# checkout's HEAD into it, and runs both commands exactly as README.md's section "The two commands" shows
# them (read from its code blocks, so they cannot drift): first as a non-root user with passwordless sudo
# (created in the root; setup.sh installs the Debian packages through sudo), then as root in its own clone.
# Prints each step's result and wall time; the logs stay in the log directory.
#
#   sudo bash scripts/fresh_root_check.sh            needs root (mmdebstrap, chroot, mounts), mmdebstrap,
#                                                    network access to deb.debian.org and PyPI, ~20 GB disk
# Environment: FRESH_ROOT_DIR (where the root is built; default a new directory under /var/tmp),
# FRESH_ROOT_USERS (default "ft root": who runs the commands, in order), FRESH_ROOT_KEEP=1 (keep the root),
# FRESH_ROOT_LOGS (default /var/tmp/flashtile-fresh-root-logs).
# Exit status: 0 when every step passed, 1 when one failed, 2 when this machine cannot run the check.
# The body is one { } block: bash reads it whole before running it, so editing this file during a run (which
# takes most of an hour) cannot change what the run executes.
{
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

if [ "$(id -u)" != 0 ]; then
  echo "fresh_root_check.sh: needs root: it builds a Debian root with mmdebstrap, chroots into it and mounts"
  echo "/proc, /sys and /dev there. Run it as root (sudo bash scripts/fresh_root_check.sh) on a Debian/Ubuntu"
  echo "machine with mmdebstrap (apt-get install mmdebstrap), network access and ~20 GB free disk."
  exit 2
fi
if ! command -v mmdebstrap >/dev/null; then
  echo "fresh_root_check.sh: mmdebstrap not found: apt-get install mmdebstrap"
  exit 2
fi

users=${FRESH_ROOT_USERS:-ft root}
logs=${FRESH_ROOT_LOGS:-/var/tmp/flashtile-fresh-root-logs}
mkdir -p "$logs"
root=${FRESH_ROOT_DIR:-$(mktemp -d /var/tmp/flashtile-fresh-root.XXXXXX)}
mounts=()
results=()
failed=0

cleanup() {
  local i
  for (( i=${#mounts[@]}-1; i>=0; i-- )); do
    umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" 2>/dev/null || echo "could not unmount ${mounts[i]}"
  done
  if grep -q " $root/" /proc/mounts; then
    echo "fresh_root_check.sh: mounts remain under $root; not deleting it"
  elif [ "${FRESH_ROOT_KEEP:-0}" = 1 ]; then
    echo "root kept in $root"
  else
    rm -rf --one-file-system "$root"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# step <name> <command...>: runs it with its output in $logs/<name>.log, prints the result and the time.
step() {
  local name=$1; shift
  local start rc secs
  start=$(date +%s)
  echo "=== $name ($(date -u +%H:%M:%S) UTC), log: $logs/$name.log"
  "$@" >"$logs/$name.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  if [ $rc = 0 ]; then
    results+=("PASS  $(printf '%5d' "$secs") s  $name")
  else
    results+=("FAIL  $(printf '%5d' "$secs") s  $name (exit $rc)")
    failed=1
    tail -25 "$logs/$name.log" | sed 's/^/    /'
  fi
  echo "${results[-1]}"
  return $rc
}

do_mount() {  # do_mount <target> <mount args...>
  mount "${@:2}" "$1" && mounts+=("$1")
}

rev=$(git -C "$here" rev-parse HEAD) || exit 2
echo "FlashTile $rev ($(git -C "$here" log -1 --format=%s "$rev" | cut -c1-80))"
echo "root: $root; logs: $logs"

# A machine whose network intercepts TLS with its own CA (as this development machine's egress proxy does)
# needs that CA in the root too, or pip cannot reach PyPI: the host's local CA certificates are copied in and
# pip is pointed at the system store. On an ordinary machine there are none and nothing is copied.
shopt -s nullglob
extra_ca=(/usr/local/share/ca-certificates/*.crt)
shopt -u nullglob
include=sudo
[ ${#extra_ca[@]} -gt 0 ] && include=sudo,ca-certificates

step mmdebstrap mmdebstrap --variant=minbase --include="$include" bookworm "$root" \
  "deb http://deb.debian.org/debian bookworm main" \
  "deb http://deb.debian.org/debian bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main" || exit 1

if [ ${#extra_ca[@]} -gt 0 ]; then
  echo "copying this machine's local CA certificates into the root: ${extra_ca[*]}"
  cp "${extra_ca[@]}" "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null || exit 2
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$root/etc/pip.conf"
fi

do_mount "$root/proc" -t proc proc || exit 2
do_mount "$root/sys" -t sysfs sysfs || exit 2
do_mount "$root/dev" --bind /dev || exit 2
do_mount "$root/dev/pts" --bind /dev/pts || exit 2
do_mount "$root/dev/shm" -t tmpfs tmpfs || exit 2
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# As an installed machine has: its host name resolves (sudo warns on every call otherwise).
grep -qw "$(hostname)" "$root/etc/hosts" 2>/dev/null || echo "127.0.1.1 $(hostname)" >> "$root/etc/hosts"

# A user with passwordless sudo (setup.sh uses sudo when not root).
chroot "$root" useradd -m -s /bin/bash ft || exit 1
echo 'ft ALL=(ALL) NOPASSWD: ALL' > "$root/etc/sudoers.d/ft"
chmod 440 "$root/etc/sudoers.d/ft"

# A clean clone of HEAD for each user (the common git dir: this checkout may be a linked worktree).
clone() {  # clone <dest> <owner>
  git clone --quiet --no-checkout "$(git -C "$here" rev-parse --path-format=absolute --git-common-dir)" "$1" &&
    git -C "$1" checkout --quiet --detach "$rev" && chroot "$root" chown -R "$2:$2" "${1#"$root"}"
}

# README.md's two commands: the ```sh code blocks of section "## The two commands", one line each.
mapfile -t cmds < <(awk '/^## /{sec=($0=="## The two commands")} sec&&/^```/{inblk=!inblk; next} sec&&inblk' \
                    <(git -C "$here" show "$rev:README.md"))
if [ ${#cmds[@]} != 2 ]; then
  echo "fresh_root_check.sh: expected 2 one-line commands in README.md's \"## The two commands\", found ${#cmds[@]}:"
  printf '  %s\n' "${cmds[@]}"
  exit 1
fi
echo "demo command: ${cmds[0]}"
echo "test command: ${cmds[1]}"

# run_as <user> <command>: a login shell of <user> in its clone, with a clean environment.
run_as() {
  local user=$1 cmd=$2 home
  if [ "$user" = root ]; then home=/root; else home=/home/$user; fi
  printf 'set -e\ncd ~/flashtile\necho "+ %s"\n%s\n' "$cmd" "$cmd" > "$root$home/readme_step.sh"
  if [ "$user" = root ]; then
    nice -n 10 chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/bash -l "$home/readme_step.sh"
  else
    nice -n 10 chroot "$root" /usr/bin/env -i TERM=dumb LANG=C.UTF-8 /bin/su - "$user" -c "bash ~/readme_step.sh"
  fi
}

for user in $users; do
  if [ "$user" = root ]; then home=/root; else home=/home/$user; fi
  clone "$root$home/flashtile" "$user" || { echo "clone failed"; exit 1; }
  step "$user-demo" run_as "$user" "${cmds[0]}"
  step "$user-test" run_as "$user" "${cmds[1]}"
  grep -E '^(=+ .*(passed|failed).* in .*=+|[0-9]+% tests passed.*|consumer_check.sh: PASS)$' \
    "$logs/$user-test.log" | sed 's/^/    /'
done

echo
echo "=== fresh Debian 12 root, FlashTile $rev, $(date -u +%Y-%m-%d)"
printf '%s\n' "${results[@]}"
[ $failed = 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL"
exit $failed
}
