#!/bin/sh
# The same start as the upstream image docker.io/library/haproxy (its docker-entrypoint.sh): arguments
# that begin with an option, or begin with "haproxy", run haproxy in master-worker mode (-W: a SIGUSR2
# to PID 1 reloads, old workers finish their streams) in the foreground (-db); anything else runs as given.
set -e
if [ "${1#-}" != "$1" ]; then
	set -- haproxy "$@"
fi
if [ "$1" = 'haproxy' ]; then
	shift
	set -- haproxy -W -db "$@"
fi
exec "$@"
