#!/bin/sh
# Builds a Lambda `provided` base image for sam local from Debian's packages, with no
# registry: FROM scratch, glibc and libgcc (what a Rust bootstrap links), the CA bundle
# (the SDK's TLS reads the system's roots, as on AL2023) and a static busybox (the shell
# SAM's image build runs `mv` and `chmod` with). SAM adds AWS's RIE on top of it, as it
# does on AWS's own provided.al2023 image.
#
#   infra/sam-local/base-image.sh <arm64|x86_64> <image tag>
#
# Only for machines that cannot pull public.ecr.aws/lambda/provided:al2023; anywhere else
# use AWS's image. Rebuilt only when the Debian packages' versions change.
set -eu
arch=$1
tag=$2
case "$arch" in
  arm64) deb_arch=arm64 ;;
  x86_64) deb_arch=amd64 ;;
  *) echo "base-image: unknown architecture $arch" >&2; exit 2 ;;
esac
packages="libc6:$deb_arch libgcc-s1:$deb_arch busybox-static:$deb_arch ca-certificates"

if [ "$(dpkg --print-architecture)" != "$deb_arch" ] \
   && ! dpkg --print-foreign-architectures | grep -qx "$deb_arch"; then
  echo "base-image: adding Debian's $deb_arch architecture, to download its packages"
  dpkg --add-architecture "$deb_arch"
  apt-get update -qq
fi
versions=$(apt-cache policy $packages | awk '/^[^ ]/ {name=$1; sub(/:$/, "", name)} /Candidate:/ {printf "%s%s=%s", sep, name, $2; sep=" "}')
if [ "$(docker image inspect -f '{{index .Config.Labels "flashsale.packages"}}' "$tag" 2>/dev/null || true)" = "$versions" ]; then
  echo "base-image: $tag is up to date ($versions)"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/debs" "$work/root"
# apt warns that root downloads unsandboxed into a folder _apt cannot read: it may.
(cd "$work/debs" && apt-get download -qq $packages 2>/dev/null)
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/root"; done
root=$work/root
# The bundle ca-certificates' own install script would write, and AL2023's name for it.
mkdir -p "$root/etc/ssl/certs" "$root/etc/pki/tls/certs"
cat "$root"/usr/share/ca-certificates/mozilla/*.crt > "$root/etc/ssl/certs/ca-certificates.crt"
ln -s ../../../ssl/certs/ca-certificates.crt "$root/etc/pki/tls/certs/ca-bundle.crt"
rm -rf "$root/usr/share" "$root/usr/sbin" "$root/etc/ca-certificates.conf"
mkdir -p "$root/bin" "$root/tmp" "$root/var/task" "$root/var/runtime" "$root/opt"
for applet in sh mv chmod cp rm mkdir ls cat env; do ln -sf busybox "$root/bin/$applet"; done
chmod 1777 "$root/tmp"
echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
echo "root:x:0:" > "$root/etc/group"
tar -C "$root" -cf "$work/rootfs.tar" .
# The variables AWS's provided.al2023 image sets.
cat > "$work/Dockerfile" <<DOCKERFILE
FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 TZ=:/etc/localtime LAMBDA_TASK_ROOT=/var/task LAMBDA_RUNTIME_DIR=/var/runtime
LABEL flashsale.packages="$versions"
WORKDIR /var/task
DOCKERFILE
platform=linux/$deb_arch
docker build -q --platform "$platform" -t "$tag" "$work" >/dev/null
# SAM tags the image it builds on this one (its RIE added) <repository>:rapid-..., and
# reuses it while the tag exists: drop those built on the old base.
docker images --format '{{.Repository}}:{{.Tag}}' "${tag%:*}" | grep ':rapid-' | xargs -r docker rmi -f >/dev/null
echo "base-image: built $tag ($platform) from $versions"
