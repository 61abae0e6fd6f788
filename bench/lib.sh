# Shared by the bench/*.sh scripts (sourced after they define say and die).

# need PROGRAM PACKAGE...: records PACKAGE when PROGRAM is missing; install_missing then installs them
# all with apt-get (after an update if the first try fails).
missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
install_missing() {
  ((${#missing[@]})) || return 0
  say "installing ${missing[*]}"
  local sudo=""
  ((EUID == 0)) || sudo="sudo"
  $sudo apt-get install -y "${missing[@]}" >/dev/null ||
    { $sudo apt-get update >/dev/null && $sudo apt-get install -y "${missing[@]}" >/dev/null; } ||
    die "could not install ${missing[*]}"
}

# Free loopback ports below 32768 (out of the usual ephemeral range), all different.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
taken=" "
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 12000))
    [[ "$taken" == *" $p "* ]] && continue
    port_in_use "$p" || port_in_use "$((p + 1))" || { taken+="$p "; echo "$p"; return; }
  done
  die "found no free port"
}
