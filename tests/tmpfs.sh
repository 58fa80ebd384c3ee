# Sourced by the tests that run posenc on a small tmpfs (disk_full.sh, read_only.sh):
#   mount_tmpfs NAME DIR OPTIONS   mounts a tmpfs with OPTIONS at DIR, unmounted on exit; exits 77
#                                  (CTest: skipped) where that needs root or is not allowed
mount_tmpfs() {
  local name=$1 dir=$2 options=$3
  if [[ $(id -u) -ne 0 ]]; then
    echo "$name: skipped: mounting a tmpfs needs root" >&2
    exit 77
  fi
  mkdir -p "$dir"
  umount "$dir" 2>/dev/null
  if ! mount -t tmpfs -o "$options" tmpfs "$dir" 2>/dev/null; then
    echo "$name: skipped: cannot mount a tmpfs here" >&2
    exit 77
  fi
  trap "umount '$dir'" EXIT
}
