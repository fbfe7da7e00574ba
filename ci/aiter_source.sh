#!/usr/bin/env bash
# Export one tagged AITER release's Python tree from a local clone of ROCm/aiter, for the gate:
#
#   ci/aiter_source.sh TAG DIR [CLONE]     ->  DIR/aiter/...  and  DIR/AITER_SOURCE
#   python -m tealite_verify gate compare --baseline ci/baselines/... --aiter DIR
#
# CLONE is a clone of ROCm/aiter (bare or not; default $AITER_CLONE).  Only the tag's aiter/
# directory is exported (git archive): no build, no submodules, nothing of AITER is committed
# here.  A source tree has no generated _version.py, so DIR/AITER_SOURCE records the tag, the
# commit and the version the tag names (v0.1.9.post1 -> 0.1.9.post1); the loader reports it.
# An existing DIR holding the same commit is reused; any other content is an error.
set -euo pipefail
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: ci/aiter_source.sh TAG DIR [CLONE]   (CLONE defaults to \$AITER_CLONE)" >&2
  exit 2
fi
tag=$1
dir=$2
clone=${3:-${AITER_CLONE:-}}
if [ -z "$clone" ]; then
  echo "ci/aiter_source.sh: no clone of ROCm/aiter given (argument 3 or \$AITER_CLONE)" >&2
  exit 2
fi
if ! git -C "$clone" rev-parse --git-dir >/dev/null 2>&1; then
  echo "ci/aiter_source.sh: CLONE $clone is not a git repository" >&2
  exit 2
fi
if ! commit=$(git -C "$clone" rev-parse --verify -q "refs/tags/$tag^{commit}"); then
  echo "ci/aiter_source.sh: TAG $tag is not a tag of $clone" >&2
  exit 2
fi
if ! git -C "$clone" cat-file -e "$commit:aiter/ops/triton" 2>/dev/null; then
  echo "ci/aiter_source.sh: $tag has no aiter/ops/triton (not an AITER release tree)" >&2
  exit 2
fi
if [ -e "$dir/AITER_SOURCE" ] && grep -qx "commit=$commit" "$dir/AITER_SOURCE"; then
  echo "$dir"  # already exported
  exit 0
fi
if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
  echo "ci/aiter_source.sh: DIR $dir exists and is not an export of $tag; remove it first" >&2
  exit 2
fi
mkdir -p "$dir"
tmp=$(mktemp -d "${dir%/}.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
git -C "$clone" archive "$commit" aiter | tar -x -C "$tmp"
{
  echo "tag=$tag"
  echo "commit=$commit"
  echo "version=${tag#v}"
  echo "date=$(git -C "$clone" log -1 --format=%cI "$commit")"
} > "$tmp/AITER_SOURCE"
mv "$tmp/aiter" "$dir/aiter"
mv "$tmp/AITER_SOURCE" "$dir/AITER_SOURCE"
echo "$dir"
