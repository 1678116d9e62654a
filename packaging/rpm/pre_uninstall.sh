# $1 = 0: erase (not an upgrade): stop and disable. An edited
# /etc/lbnodeagent/lbnodeagent.toml is kept as .rpmsave.
if [ "$1" -eq 0 ]; then
    systemctl --no-reload disable --now lbnodeagent.service >/dev/null 2>&1 || :
fi
