# One runner for the lent-GPU measurements: runs scripts/device/recipes/RECIPE.sh from the repository root.
#   bash scripts/device/run.sh RECIPE [NAME=value ...]
#     e.g. PARTS="shippedN shipped1" BUDGET_S=575 bash scripts/device/run.sh shipped_simpo_node
#   bash scripts/device/run.sh --list                     every recipe with its one-line description
# Settings reach a recipe as environment variables, set before the command as usual or given as NAME=value words
# after the recipe (exported; `bash scripts/device/run.sh shipped_simpo_node PARTS=shipped1` is the same as
# `PARTS=shipped1 bash scripts/device/run.sh shipped_simpo_node`). A recipe's first comment line is its description,
# the rest of its header says what it measures and which settings it reads. No recipe, --list, -h or an unknown
# recipe prints the list; all but --list and -h exit 2. The exit status is otherwise the recipe's.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RECIPES=$ROOT/scripts/device/recipes

list() {
  local f name
  echo "Recipes (bash scripts/device/run.sh RECIPE [NAME=value ...]; old callX names: scripts/device/README.md):"
  for f in "$RECIPES"/*.sh; do
    name=$(basename "$f" .sh)
    printf '  %-32s %s\n' "$name" "$(sed -n '1s/^# *//p' "$f")"
  done
}

case ${1:-} in
  --list|-l|-h|--help) list; exit 0 ;;
  "") echo "run.sh: no recipe given" >&2; list >&2; exit 2 ;;
esac
RECIPE=${1%.sh}; shift
if [[ ! $RECIPE =~ ^[a-z0-9_]+$ || ! -f $RECIPES/$RECIPE.sh ]]; then
  echo "run.sh: unknown recipe '$RECIPE'" >&2; list >&2; exit 2
fi
for kv in "$@"; do
  if [[ ! $kv =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then
    echo "run.sh: '$kv' is not a NAME=value setting (recipes read their settings from the environment)" >&2; exit 2
  fi
  export "$kv"
done
cd "$ROOT" || exit 1  # recipes source scripts/device/common.sh and name configs/ relative to the root
exec bash "$RECIPES/$RECIPE.sh"
