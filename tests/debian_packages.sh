# sourced by tests/run_vulkan.sh and tests/run_aarch64.sh: install the Debian packages a target needs
# as root, or say which ones in one error line and stop.
# Usage: need_debian_packages TARGET PACKAGE... (the packages not yet installed)
need_debian_packages() {
    local target=$1
    shift
    [ $# -gt 0 ] || return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null
    else
        echo "error: $target needs the Debian packages $*; install them (apt-get install $*) and run again" >&2
        exit 1
    fi
}
