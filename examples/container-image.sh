#!/bin/sh
# Makes a busybox image for examples/container.toml, offline: a `docker save` archive of
# busybox-static (apt-get install busybox-static) and its applets, with no registry needed.
#
#   sh examples/container-image.sh [/var/tmp/wharf-busybox.tar]
#
# With network access, any image does as well:
#   skopeo copy docker://docker.io/library/busybox:latest docker-archive:/var/tmp/wharf-busybox.tar
set -eu
out=${1:-/var/tmp/wharf-busybox.tar}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rootfs/bin" "$work/rootfs/etc" "$work/rootfs/tmp" "$work/image"
chmod 1777 "$work/rootfs/tmp"
cp /bin/busybox "$work/rootfs/bin/busybox"
for applet in sh echo cat sleep ls id env hostname true false; do
    ln -s busybox "$work/rootfs/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$work/rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$work/rootfs/etc/group"
tar -C "$work/rootfs" --numeric-owner --owner=0 --group=0 -cf "$work/image/layer.tar" .
diff_id=$(sha256sum "$work/image/layer.tar" | cut -d' ' -f1)
printf '{"architecture":"amd64","os":"linux","config":{"Cmd":["sh"],"Env":["PATH=/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$diff_id" > "$work/image/config.json"
printf '[{"Config":"config.json","RepoTags":["busybox:latest"],"Layers":["layer.tar"]}]' > "$work/image/manifest.json"
tar -C "$work/image" -cf "$out" manifest.json config.json layer.tar
echo "$out"
