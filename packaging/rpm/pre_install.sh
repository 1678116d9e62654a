# The service user, before the files it owns are laid down.
if ! getent passwd lbnodeagent >/dev/null; then
    useradd --system --user-group --home-dir /nonexistent --no-create-home \
        --shell /sbin/nologin --comment "hostlb node agent" lbnodeagent
fi
