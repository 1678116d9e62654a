# $1 = 1: first install: enable, do not start (the unit waits for
# /etc/lbnodeagent/kubeconfig). $1 > 1: upgrade: restart a running agent.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -eq 1 ]; then
    systemctl --no-reload enable lbnodeagent.service >/dev/null 2>&1 || :
elif [ -d /run/systemd/system ]; then
    systemctl try-restart lbnodeagent.service >/dev/null 2>&1 || :
fi
