#!/bin/sh
# PID 1 of the machine `cargo xtask cgroup2` boots (see xtask/src/cgroup2.rs): mounts what a
# system has, hands the cgroup controllers down as an init does for its services, runs each
# suite of /wharf-ci/suites in a cgroup of its own, reports on the second serial port, and
# powers off.
export PATH=/bin HOME=/root

report() {
    echo "wharf-cgroup2: $*" > /dev/ttyS1
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# /tmp stays the initramfs's own (a tmpfs already): the programs may live below it, at their
# paths on the machine that built them.
mount -t cgroup2 cgroup2 /sys/fs/cgroup
ip link set lo up
report booted

# The root offers every controller; an init enables them for its first level (systemd's
# slices), and a slice for the services below it. Each suite runs in a service's cgroup,
# with nothing enabled below it: that is up to the code under test, as for a delegated
# service.
controllers=""
for controller in cpuset cpu memory pids; do
    grep -qw "$controller" /sys/fs/cgroup/cgroup.controllers && controllers="$controllers +$controller"
done
echo "$controllers" > /sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/ci.slice
echo "$controllers" > /sys/fs/cgroup/ci.slice/cgroup.subtree_control
echo "cgroup v2: $(cat /sys/fs/cgroup/cgroup.controllers); enabled:$controllers"

cd /tmp
while read -r name program args; do
    service="/sys/fs/cgroup/ci.slice/$name.service"
    mkdir "$service"
    echo "==> $name"
    # The suite's process joins its cgroup, then becomes the test binary.
    timeout @SUITE_LIMIT@ sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$service" \
        "$program" $args < /dev/null
    report "$name exit $?"
done < /wharf-ci/suites
report done
sync
poweroff -f
