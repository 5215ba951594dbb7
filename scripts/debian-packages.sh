# Sourced (not run) by scripts/test.sh and scripts/build-windows.sh: `install_debian_packages WHAT
# PACKAGE...` installs the Debian packages of the list that are missing, with apt-get as root or
# through `sudo -n`; without either it prints the apt-get command that would, naming WHAT needs
# them, and exits 1.

install_debian_packages() {
    local what=$1 script package
    shift
    script=$(basename "$0")
    local missing=()
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$package")
    done
    [[ ${#missing[@]} -gt 0 ]] || return 0
    local as_root=()
    if [[ $(id -u) -ne 0 ]]; then
        if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
            as_root=(sudo -n)
        else
            echo "$script: $what needs these Debian packages: ${missing[*]}" >&2
            echo "$script: install them with: sudo apt-get install --no-install-recommends ${missing[*]}" >&2
            exit 1
        fi
    fi
    echo "$script: installing ${missing[*]}" >&2
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}
