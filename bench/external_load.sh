#!/usr/bin/env bash
# Standard load tools against `ignis serve`: aiperf and guidellm, each in its own venv.
#
# Each tool is installed once, pinned, into its own venv under
# ${IGNIS_BENCH_VENVS:-$HOME/.cache/ignis-bench}/<tool> and reused after that;
# the project's .venv is never touched. Without --url the script starts
# `ignis serve --port 0` on the demo model (or --model DIR) and stops it at the
# end (SIGTERM to its process group). Both tools send the same shape of
# shared-prefix agent load, built by their own synthetic generators:
#
#   PREFIXES long prompts of PREFIX_TOKENS tokens each, shared by all the
#   requests (spread over them), then a per-request user turn of USER_TOKENS
#   tokens; OUTPUT_TOKENS tokens back (ignore_eos), streamed, at CONCURRENCY.
#   guidellm sends the prefix as the system message; aiperf puts it at the
#   start of the user message.
#
# Every run is bounded in requests and in seconds. The tools' exported JSON
# lands in --out (default bench/out/external_load/) and
# bench/external_load_report.py turns it into one table; its last line is
#
#   BENCH external_load aiperf_ttft_p50_ms=.. aiperf_ttft_p99_ms=.. aiperf_itl_p50_ms=.. aiperf_out_tok_s=..
#         aiperf_cached_pct=.. aiperf_ok=.. aiperf_errors=.. guidellm_ttft_p50_ms=.. ... guidellm_errors=..
#
# (cached_pct: the share of prompt tokens the server reported as cached). docs/benchmarks.md has the
# dataset, the tables measured and how to read them.
#
# Default: 64 requests per tool at concurrency 8, 4 prefixes x 1024 tokens, 64-token
# user turns, 64 tokens out, at most 600 s per tool. --quick: 6 requests at
# concurrency 2, 2 prefixes x 256 tokens, 32-token user turns, 16 out, 180 s.
# The script exits non-zero when a tool fails to run or any request errored.
#
#   bash bench/external_load.sh [--quick] [--url URL] [--model DIR] [--tokenizer DIR]
#                               [--requests N] [--concurrency C] [--out DIR] [--only aiperf|guidellm]
set -uo pipefail
cd "$(dirname "$0")/.."

AIPERF_SPEC="aiperf==0.13.0"
GUIDELLM_SPEC="guidellm==0.8.1"
VENVS="${IGNIS_BENCH_VENVS:-$HOME/.cache/ignis-bench}"
if [[ -n "${IGNIS_PYTHON:-}" ]]; then PY="$IGNIS_PYTHON"
elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
else PY=python3; fi

url="" model="" tokenizer="" out="bench/out/external_load" only=""
requests=64 concurrency=8 prefixes=4 prefix_tokens=1024 user_tokens=64 output_tokens=64 max_seconds=600
while (($#)); do
    case "$1" in
        --url|--model|--tokenizer|--requests|--concurrency|--out|--only)
            (($# >= 2)) || { echo "external_load.sh: $1 needs a value" >&2; exit 2; } ;;
    esac
    case "$1" in
        --quick) requests=6 concurrency=2 prefixes=2 prefix_tokens=256 user_tokens=32 output_tokens=16
                 max_seconds=180 ;;
        --url) url="$2"; shift ;;
        --model) model="$2"; shift ;;
        --tokenizer) tokenizer="$2"; shift ;;
        --requests) requests="$2"; shift ;;
        --concurrency) concurrency="$2"; shift ;;
        --out) out="$2"; shift ;;
        --only) only="$2"; shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "external_load.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[[ -z "$only" || "$only" == aiperf || "$only" == guidellm ]] || { echo "external_load.sh: --only aiperf|guidellm" >&2; exit 2; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"

die() { echo "external_load.sh: $*" >&2; exit 1; }

# ----- the tools' venvs -------------------------------------------------------
ensure_venv() {  # name spec -> the venv's bin directory on stdout
    local dir="$VENVS/$1"
    if [[ ! -f "$dir/.installed" ]] || [[ "$(cat "$dir/.installed")" != "$2" ]]; then
        echo "installing $2 into $dir" >&2
        python3 -m venv --clear "$dir" >&2 || return 1
        "$dir/bin/pip" install -q "$2" >&2 || return 1
        echo "$2" > "$dir/.installed"
    fi
    echo "$dir/bin"
}

# ----- the server -------------------------------------------------------------
serve_pid="" runtime=""
stop_serve() {
    if [[ -n "$serve_pid" ]]; then
        kill -TERM -- "-$serve_pid" 2>/dev/null
        wait "$serve_pid" 2>/dev/null
        serve_pid=""
    fi
    [[ -z "$runtime" ]] || rm -rf "$runtime"
    runtime=""
}
trap stop_serve EXIT
trap 'exit 130' INT TERM

if [[ -z "$url" ]]; then
    runtime="$(mktemp -d /tmp/ignis-extload.XXXXXX)"
    argv=(-m ignis.launcher.cli serve --port 0 --runtime-dir "$runtime" --instance extload
          --reuse-kv-host-pool-bytes 64M)
    [[ -n "$model" ]] && argv+=(--model "$model")
    : > "$out/serve.out"
    setsid env PYTHONUNBUFFERED=1 "$PY" "${argv[@]}" > "$out/serve.out" 2> "$out/serve.log" &
    serve_pid=$!
    deadline=$((SECONDS + 300))
    until url="$(sed -n 's/^ignis serving [^ ]* on \(http:[^ ]*\).*/\1/p' "$out/serve.out")"; [[ -n "$url" ]]; do
        kill -0 "$serve_pid" 2>/dev/null || die "ignis serve exited: $(tail -c 3000 "$out/serve.log")"
        ((SECONDS < deadline)) || die "ignis serve did not start in 300 s: $(tail -c 3000 "$out/serve.log")"
        sleep 0.5
    done
    echo "ignis serve on $url (log: $out/serve.log)"
fi

served_model="$("$PY" -c 'import json, sys, urllib.request
print(json.load(urllib.request.urlopen(sys.argv[1] + "/v1/models", timeout=30))["data"][0]["id"])' "$url")" \
    || die "GET $url/v1/models failed"
if [[ -z "$tokenizer" ]]; then
    if [[ -n "$model" ]]; then tokenizer="$model"
    else tokenizer="$("$PY" -c 'from ignis.shared.demo import ensure_demo_model; print(ensure_demo_model())')" \
        || die "no demo model here for the tokenizer; pass --tokenizer DIR"
    fi
fi
echo "model $served_model, tokenizer $tokenizer; $requests requests at concurrency $concurrency," \
     "$prefixes shared prefixes x $prefix_tokens tokens + $user_tokens-token user turns, $output_tokens out"

status=0
reports=()

# ----- aiperf -----------------------------------------------------------------
run_aiperf() {
    local bin dir="$out/aiperf"
    bin="$(ensure_venv aiperf "$AIPERF_SPEC")" || { echo "aiperf: install failed" >&2; return 1; }
    rm -rf "$dir"
    # No HF_HUB_OFFLINE here: aiperf 0.13 then looks a local tokenizer path up as a hub repo id and fails.
    # --use-server-token-count: the demo model's random text does not re-tokenize to the same count.
    timeout --signal=INT --kill-after=30 "$((max_seconds + 120))" \
    "$bin/aiperf" profile \
        --model "$served_model" --url "$url" --endpoint-type chat --streaming \
        --tokenizer "$tokenizer" --use-server-token-count \
        --prefix-prompt-pool-size "$prefixes" --prefix-prompt-length "$prefix_tokens" \
        --synthetic-input-tokens-mean "$user_tokens" --synthetic-input-tokens-stddev 0 \
        --output-tokens-mean "$output_tokens" --output-tokens-stddev 0 \
        --extra-inputs ignore_eos:true \
        --concurrency "$concurrency" --request-count "$requests" --benchmark-duration "$max_seconds" \
        --random-seed 7 --ui-type none --artifact-dir "$dir" > "$out/aiperf.log" 2>&1
    local rc=$?
    [[ $rc -eq 0 ]] || { echo "aiperf exited $rc; log: $out/aiperf.log" >&2; tail -n 30 "$out/aiperf.log" >&2; return 1; }
    reports+=(--aiperf "$(find "$dir" -name profile_export_aiperf.json | head -n 1)")
}

# ----- guidellm ---------------------------------------------------------------
run_guidellm() {
    local bin dir="$out/guidellm"
    bin="$(ensure_venv guidellm "$GUIDELLM_SPEC")" || { echo "guidellm: install failed" >&2; return 1; }
    rm -rf "$dir"; mkdir -p "$dir"
    # guidellm sends ignore_eos and max_completion_tokens itself when the data sets output_tokens.
    timeout --signal=INT --kill-after=30 "$((max_seconds + 120))" \
    env HF_HUB_OFFLINE=1 "$bin/guidellm" run \
        --backend "kind=openai_http,target=$url,model=$served_model,request_format=/v1/chat/completions" \
        --tokenizer "kind=huggingface_auto,model=$tokenizer" \
        --data "kind=synthetic_text,prompt_tokens=$user_tokens,output_tokens=$output_tokens,prefix_tokens=$prefix_tokens,prefix_count=$prefixes" \
        --profile "kind=concurrent,streams=$concurrency" \
        --constraint "kind=max_requests,count=$requests" --constraint "kind=max_duration,seconds=$max_seconds" \
        --seed kind=static,value=7 --output "kind=json,path=$dir/benchmarks.json" --disable-console-interactive > "$out/guidellm.log" 2>&1
    local rc=$?
    [[ $rc -eq 0 ]] || { echo "guidellm exited $rc; log: $out/guidellm.log" >&2; tail -n 30 "$out/guidellm.log" >&2; return 1; }
    reports+=(--guidellm "$dir/benchmarks.json")
}

if [[ "$only" != guidellm ]]; then run_aiperf || status=1; fi
if [[ "$only" != aiperf ]]; then run_guidellm || status=1; fi
stop_serve
((${#reports[@]})) || die "no tool produced a report"
"$PY" bench/external_load_report.py "${reports[@]}" || status=1
exit "$status"
