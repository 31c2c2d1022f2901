# Sourced by the per-pair scripts: the seven shipped pairs (trio/weak+strong, the names under
# assets/scheduler/) and how a drafter's name is spelled on the command line.
SHIPPED_PAIRS=(qwen-coder/ngram+qwen-coder-0.5b qwen-coder/qwen-coder-weak+qwen-coder-0.5b
  qwen-coder/ngram+qwen-coder-weak smollm2/weak+strong smollm2/ngram+strong smollm2/ngram+weak smollm2/weak+ngram)
role() {  # an asset drafter's name on the command line
  case $1 in ngram|qwen-coder-0.5b) echo "$1" ;; *) echo "asset:$1" ;; esac
}
