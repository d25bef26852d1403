#!/bin/sh
# `make sam-local`: the bootstraps build-lambdas made, run by the real SAM CLI on this
# machine's Docker: `sam local invoke` of every function with its events/ fixtures, then
# `sam local start-api` (flashsale-smoke --sam walks both).
#
# Starts dockerd if none answers, and stops what it started. Arm64 containers on another
# host run under qemu-user-static's binfmt handler. The image is AWS's
# public.ecr.aws/lambda/provided:al2023-<arch> when it can be pulled (or is here
# already); where no registry is reachable, one built from Debian's packages
# (base-image.sh). SAM_LOCAL_IMAGE=aws or =local forces either.
#
#   infra/sam-local/run.sh <sam> <smoke binary> <lambda dir>
set -eu
sam=$1
smoke=$2
lambda_dir=$3
here=$(dirname "$0")
arch=$(cat "$lambda_dir/ARCH")
host=$(uname -m | sed 's/aarch64/arm64/')
out=target/sam-local
mkdir -p "$out"

started_dockerd=""
stop_dockerd() {
  if [ -n "$started_dockerd" ]; then
    kill "$started_dockerd" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$started_dockerd" 2>/dev/null || break; sleep 0.2; done
    echo "sam-local: stopped the dockerd it started"
  fi
}
trap stop_dockerd EXIT
trap 'exit 130' INT TERM HUP

if ! docker info >/dev/null 2>&1; then
  echo "sam-local: no Docker engine answers; starting dockerd (log: $out/dockerd.log)"
  # Published ports by iptables' DNAT, not docker-proxy: the proxy accepts a connection
  # before the container listens, so SAM's wait for the socket passes at once and its
  # three HTTP retries (0.7 s) expire before an arm64 RIE under qemu listens ("No
  # response from invoke container"). With DNAT, a connection is refused until the RIE
  # listens, and SAM waits for it as it means to.
  dockerd --userland-proxy=false >"$out/dockerd.log" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 1 150); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
  docker info >/dev/null 2>&1 || { echo "sam-local: dockerd did not start"; tail -20 "$out/dockerd.log"; exit 1; }
fi

if [ "$arch" != "$host" ]; then
  qemu_arch=$(echo "$arch" | sed 's/arm64/aarch64/')
  handler=/proc/sys/fs/binfmt_misc/qemu-$qemu_arch
  [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  if [ ! -e "$handler" ]; then
    # F: the handler is opened now, so it works inside containers too.
    cat "/usr/lib/binfmt.d/qemu-$qemu_arch.conf" > /proc/sys/fs/binfmt_misc/register
  fi
  grep -q "^flags: .*F" "$handler" || { echo "sam-local: $handler lacks flag F: $(cat "$handler")"; exit 1; }
  echo "sam-local: $arch containers run under $(sed -n 's/^interpreter //p' "$handler")"
fi

aws_image=public.ecr.aws/lambda/provided:al2023-$arch
image=""
case "${SAM_LOCAL_IMAGE:-auto}" in
  aws) image=$aws_image ;;
  local) ;;
  auto)
    if docker image inspect "$aws_image" >/dev/null 2>&1 || timeout 60 docker pull -q "$aws_image" >/dev/null 2>&1; then
      image=$aws_image
    else
      echo "sam-local: $aws_image cannot be pulled here (no registry); building a base image from Debian's packages"
    fi ;;
  *) echo "sam-local: SAM_LOCAL_IMAGE is aws, local or auto, not $SAM_LOCAL_IMAGE"; exit 2 ;;
esac
if [ -z "$image" ]; then
  image=flashsale/provided.al2023-local:$arch
  "$here/base-image.sh" "$arch" "$image" 2>&1 | grep -v "^DEPRECATED\|buildx\|docs.docker.com\|^ *$" || true
  docker image inspect "$image" >/dev/null
fi

# The template as `sam build` leaves it, on the bootstraps build-lambdas made (the same
# cargo-lambda build `sam build` runs, once for all five): each CodeUri names its
# function's built folder (the crate folder's name is its bin's, which the template
# checks hold).
template=$out/template.yaml
sed -E "s#^( +CodeUri: )functions/([a-z-]+)\$#\1$(pwd)/$lambda_dir/\2#" template.yaml > "$template"
test "$(grep -c "CodeUri: $(pwd)/$lambda_dir/" "$template")" -eq "$(grep -c 'CodeUri:' template.yaml)" \
  || { echo "sam-local: not every CodeUri was pointed at $lambda_dir"; exit 1; }

# The default bridge's gateway: its IPAM config names it on newer engines; else it is the
# bridge interface's own address.
gateway=$(docker network inspect bridge -f '{{(index .IPAM.Config 0).Gateway}}')
if [ -z "$gateway" ]; then
  bridge=$(docker network inspect bridge -f '{{index .Options "com.docker.network.bridge.name"}}')
  gateway=$(ip -4 -o addr show "${bridge:-docker0}" | awk '{print $4}' | cut -d/ -f1 | head -1)
fi
[ -n "$gateway" ] || { echo "sam-local: no address for the Docker bridge's gateway"; exit 1; }
"$smoke" --sam "$sam" --sam-template "$template" --invoke-image "$image" \
  --docker-host-ip "$gateway" --lambda-dir "$lambda_dir" --events events --template template.yaml
