#!/usr/bin/env python3
"""Writes a deployment of the committed repositories with different placement or sizes.

The committed config.pbtxt files are the CPU default (llm engine llama_cpp); this is the one place
that changes them. `--engine hf` serves transformers instead (--gpus alone does too).
Each model's config is rewritten, its version folder is a symlink to the committed one, so
code is never copied.

    scripts/configure.py --out /tmp/deploy --dp 2 --detokenizers 4
    scripts/configure.py --out /tmp/deploy --engine hf
    scripts/configure.py --out /tmp/deploy --gpus 0,1 --engine tensorrt_llm
    scripts/configure.py --out /tmp/deploy --dp 2 --engine synthetic --set llm.synthetic_step_ms=10
    scripts/configure.py --out /tmp/deploy --queue encoder=256:2000 --queue llm=128:30000
    scripts/configure.py --out /tmp/deploy --queue-delay llm_tokenizer=2000 --queue-delay llm=2000
    scripts/configure.py --out /tmp/deploy --llmapi-decoupled
    TRITONFRONT_REPOSITORIES=/tmp/deploy/model_repository:/tmp/deploy/ensembles scripts/serve.sh

The committed files' tensors that a contract decides are written from its declaration (DECLARATIONS):
    scripts/configure.py --write-committed
"""
import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path


def run_in_project_venv() -> None:
    """Started by another Python (the shebang's python3), re-executes this script with the venv's,
    the one scripts/env.sh names, so it runs as README writes it from any shell."""
    env_sh = Path(__file__).resolve().parent / "env.sh"
    venv = subprocess.run(["bash", "-c", 'source "$1" && printf %s "$VENV"', "env.sh", env_sh],
                          check=True, capture_output=True, text=True).stdout
    if Path(sys.prefix).resolve() == Path(venv).resolve():
        return
    python = Path(venv) / "bin" / "python"
    if not python.exists():
        sys.exit(f"{python} not found: run scripts/setup.sh first")
    os.execv(python, [str(python), __file__, *sys.argv[1:]])


if __name__ == "__main__":  # imported (by a test), it is already in some venv: never replace that process
    run_in_project_venv()

from google.protobuf import text_format  # noqa: E402 (installed in the venv entered above)
from tritonclient.grpc import model_config_pb2  # noqa: E402

from tritonfront.core import config_tensors, llmapi_contract, trtllm_contract  # noqa: E402
from tritonfront.core.llmapi_contract import DECOUPLED_MODEL_NAME, MODEL_NAME as LLMAPI_MODEL  # noqa: E402
from tritonfront.core.model_config import CONFIGS, PARAMETERS, ConfigError, validate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPOSITORIES = ("model_repository", "ensembles")
# Models whose work is a transformer forward pass: the ones --gpus moves to the GPU.
GPU_MODELS = ("encoder", "llm")
# What an engine needs beyond its name. llama_cpp: 64 sequences; a request runs in a slot of 512
# cells of its own while its tokens fit (llama-server's -np layout: each sequence attends over its
# own cells, so 64 short streams run as fast as there), else in a pool of 32,768 cells that any
# request may fill up to the model's context (8,192 for SmolLM2), with prefix reuse on; the two
# take 1.4 GiB for SmolLM2 (22.5 KiB per token), as the 64 x 1,024 slots did before
# (docs/configuration.md, The llama.cpp engine). --set overrides.
ENGINE_PARAMETERS = {"llama_cpp": {"max_num_seqs": "64", "kv_slot_tokens": "512", "kv_cache_tokens": "32768",
                                   "prompt_cache": "true"}}
# The committed llm runs llama_cpp, the fastest engine on the CPU (README, The default engine): its
# config.pbtxt carries ENGINE_PARAMETERS["llama_cpp"] (tests/unit/test_configure.py keeps them
# equal). hf: 256 sequences in transformers' paged cache of 32,768 tokens (no slots; prompt_cache
# is llama_cpp's alone).
COMMITTED_ENGINE = "llama_cpp"
ENGINE_PARAMETERS["hf"] = {"max_num_seqs": "256", "kv_slot_tokens": "0", "kv_cache_tokens": "32768"}
# On GPUs without --engine: hf. The llama-cpp-python that setup.sh builds is CPU-only, and the
# images (TRITONFRONT_TRITON_HOME) have no llama.cpp at all.
GPU_DEFAULT_ENGINE = "hf"
# The declarations whose tensors the committed configs carry between their GENERATED markers
# (tritonfront.core.config_tensors): --write-committed rewrites those lines from them.
DECLARATIONS = (trtllm_contract.GENERATE_PIPELINE, llmapi_contract.LLMAPI_PIPELINE, llmapi_contract.LLMAPI_MODEL)
# synthetic, for capacity runs of up to 1,024 streams per rank: all of them in the running batch and
# held by the rank (not in Triton's queue), and a KV cache that never limits them (0: max_num_seqs
# whole contexts); --set llm.kv_cache_tokens=N models a GPU's cache instead.
ENGINE_PARAMETERS["synthetic"] = {"max_num_seqs": "1024", "max_active_requests": "1024", "kv_cache_tokens": "0"}


def load(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def set_count(config, count: int) -> None:
    del config.instance_group[:]
    config.instance_group.add(count=count, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)


def place_on_gpus(config, gpus: list[int], one_group_per_gpu: bool) -> None:
    """One group per GPU makes each GPU a DP rank of its own (the llm); otherwise one instance
    per listed GPU in a single group."""
    del config.instance_group[:]
    kind = model_config_pb2.ModelInstanceGroup.KIND_GPU
    if one_group_per_gpu:
        for gpu in gpus:
            config.instance_group.add(count=1, kind=kind, gpus=[gpu])
    else:
        config.instance_group.add(count=1, kind=kind, gpus=gpus)


def set_queue(config, spec: str) -> None:
    """SIZE[:TIMEOUT_MS]: the queue size and timeout of the model's default queue policy."""
    size, _, timeout_ms = spec.partition(":")
    policy = config.dynamic_batching.default_queue_policy
    policy.max_queue_size = int(size)
    if timeout_ms:
        policy.default_timeout_microseconds = int(timeout_ms) * 1000


def set_queue_delay(config, microseconds: str) -> None:
    config.dynamic_batching.max_queue_delay_microseconds = int(microseconds)


def llm_ranks(config) -> int:
    return sum(group.count or 1 for group in config.instance_group)


def delay_conflict(name: str, config) -> str:
    """Why this model's batcher must not wait for a burst, or "" when it may."""
    if name == "llm" and llm_ranks(config) > 1:
        # With a queue delay Triton's batcher does not close a batch at the preferred size and
        # keeps adding queued requests to the one it handed a rank
        # (test_dp_ranks_stay_balanced_by_tokens: ranks 24:1 apart).
        return (f"with {llm_ranks(config)} llm ranks (--dp / --gpus): several ranks take one request per execute, "
                "and with a delay Triton's batcher hands one rank a whole burst")
    size = config.dynamic_batching.default_queue_policy.max_queue_size
    if 0 < size < config.max_batch_size:
        # A burst waits out the delay in the queue, where it counts against the size.
        return (f"with --queue {name}={size}: requests wait out the delay in the queue, which must hold a batch "
                f"({config.max_batch_size}) for them")
    return ""


class DelayConflict(Exception):
    """An explicit --queue-delay that the rest of the deployment rules out (delay_conflict)."""


def set_parameter(config, key: str, value: str) -> None:
    config.parameters[key].string_value = value


def build(args) -> list[tuple[str, Path, model_config_pb2.ModelConfig]]:
    """(repository, committed model folder, rewritten config) of every model; raises
    DelayConflict before anything is written."""
    counts = {"llm": args.dp, "detokenizer": args.detokenizers, "tokenizer": args.tokenizers,
              "llm_tokenizer": args.tokenizers, "encoder": args.encoders, "pooler": args.poolers}
    overrides = [item.partition("=") for item in args.set]
    queues = dict(item.split("=", 1) for item in args.queue)
    delays = dict(item.split("=", 1) for item in args.queue_delay)
    built = []
    for repository in REPOSITORIES:
        for model_dir in sorted((ROOT / repository).iterdir()):
            config_file = model_dir / "config.pbtxt"
            if not config_file.exists():
                continue
            config = load(config_file)
            name = config.name or model_dir.name  # Triton names a model without `name` after its folder
            if args.llmapi_decoupled and name == LLMAPI_MODEL:
                continue  # the decoupled model takes its name, as decoupled: True in NVIDIA's model.yaml
            if args.llmapi_decoupled and name == DECOUPLED_MODEL_NAME:
                config.name = LLMAPI_MODEL
            if counts.get(name):
                set_count(config, counts[name])
            if args.gpus and name in GPU_MODELS:
                place_on_gpus(config, args.gpus, one_group_per_gpu=name == "llm")
            if name == "llm" and llm_ranks(config) > 1:
                # Several ranks: one request per execute, so that the balancing gate (or Triton's
                # own placement) spreads a burst over them; a batch would all go to one rank. One
                # rank takes every queued request per execute (its config.pbtxt says why).
                config.dynamic_batching.preferred_batch_size[:] = [1]
            if name in queues:
                set_queue(config, queues[name])
            if name in delays:
                set_queue_delay(config, delays[name])
            conflict = delay_conflict(name, config) if config.dynamic_batching.max_queue_delay_microseconds else ""
            if conflict and name in delays:
                raise DelayConflict(f"--queue-delay {name}={delays[name]} {conflict}")
            if conflict:  # the committed wait, which this deployment rules out
                config.dynamic_batching.max_queue_delay_microseconds = 0
            engine = args.engine or next((value for key, _, value in overrides if key == "llm.engine"), None)
            if args.gpus and not engine:
                engine = GPU_DEFAULT_ENGINE
            if engine and name == "llm":
                set_parameter(config, "engine", engine)
                for parameter, value in ENGINE_PARAMETERS.get(engine, {}).items():
                    set_parameter(config, parameter, value)
            for key, _, value in overrides:
                model, _, parameter = key.partition(".")
                if model == name:
                    set_parameter(config, parameter, value)
            built.append((repository, model_dir, config))
    return built


def write(out: Path, built) -> Path:
    out = out.resolve()
    for repository in REPOSITORIES:
        if (out / repository).exists():
            shutil.rmtree(out / repository)
    for repository, model_dir, config in built:
        target = out / repository / (config.name or model_dir.name)
        target.mkdir(parents=True)
        (target / "config.pbtxt").write_text(
            f"# Generated by scripts/configure.py from {(model_dir / 'config.pbtxt').relative_to(ROOT)}\n"
            + text_format.MessageToString(config))
        for version in model_dir.iterdir():
            if version.is_dir():
                (target / version.name).symlink_to(version)
    return out


def count(text: str) -> int:
    """An instance count: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1: a model needs at least one instance")
    return value


def gpu_list(text: str) -> list[int]:
    try:
        gpus = [int(gpu) for gpu in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of GPU indices") from None
    if not gpus or min(gpus) < 0 or len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"{text!r}: GPU indices must be distinct integers >= 0")
    return gpus


def check_overrides(parser, items: list[str]) -> None:
    """--set MODEL.PARAM=VALUE against each model's typed config (tritonfront.core.model_config): the
    model, the parameter and the value must all be ones the model accepts at load time."""
    for item in items:
        key, equals, value = item.partition("=")
        model, dot, parameter = key.partition(".")
        if not equals or not dot or not model or not parameter:
            parser.error(f"--set {item!r}: expected MODEL.PARAM=VALUE, e.g. llm.balancing=none")
        if model not in CONFIGS:
            parser.error(f"--set {item!r}: unknown model {model!r}; models with parameters: {', '.join(CONFIGS)}")
        if parameter not in PARAMETERS[model]:
            parser.error(f"--set {item!r}: {model} has no parameter {parameter!r}; its parameters: "
                         f"{', '.join(PARAMETERS[model])}")
        try:
            validate(model, parameter, value)
        except ConfigError as error:
            parser.error(f"--set {item!r}: {error}")


def batcher_item(parser, flag: str, item: str, shape: str, lacks: str) -> str:
    """MODEL=VALUE for a model with a dynamic batcher: its VALUE, or the parser's error."""
    model, equals, value = item.partition("=")
    if not equals or model not in CONFIGS:
        parser.error(f"{flag} {item!r}: expected {shape} with MODEL one of {', '.join(CONFIGS)}")
    if CONFIGS[model].NO_BATCHER:
        parser.error(f"{flag} {item!r}: {model} has {lacks} (model_repository/{model}/config.pbtxt says why)")
    return value


LARGEST = 2**63 - 1  # the config's 64-bit fields (queue size, microseconds)


def whole_number(text: str, least: int, most: int = LARGEST) -> bool:
    """Whether text is an integer from least to most (str.isdigit alone takes digits int()
    refuses, such as superscripts)."""
    try:
        return least <= int(text) <= most and text.strip() == text
    except ValueError:
        return False


def check_queues(parser, items: list[str]) -> None:
    for item in items:
        spec = batcher_item(parser, "--queue", item, "MODEL=SIZE[:TIMEOUT_MS]", "no queue policy, no dynamic batcher")
        size, _, timeout_ms = spec.partition(":")
        # The timeout is written in microseconds.
        for name, text, most in (("SIZE", size, LARGEST), ("TIMEOUT_MS", timeout_ms or "1", LARGEST // 1000)):
            if not whole_number(text, 1, most):
                parser.error(f"--queue {item!r}: {name} must be an integer from 1 to {most}, got {text!r}")


def check_queue_delays(parser, items: list[str]) -> None:
    for item in items:
        microseconds = batcher_item(parser, "--queue-delay", item, "MODEL=MICROSECONDS", "no dynamic batcher")
        if not whole_number(microseconds, 0):
            parser.error(f"--queue-delay {item!r}: MICROSECONDS must be an integer from 0 to {LARGEST}, got {microseconds!r}")


def write_committed(parser, args) -> None:
    """Rewrites the committed configs' generated tensors from DECLARATIONS; nothing is written when
    a file lacks its markers."""
    given = [name for name, value in vars(args).items()
             if name != "write_committed" and value != parser.get_default(name)]
    if given:
        parser.error(f"--write-committed rewrites the committed files only; it takes no --{given[0].replace('_', '-')}")
    try:
        changed = config_tensors.write_committed(ROOT, REPOSITORIES, DECLARATIONS)
    except ValueError as error:
        sys.exit(f"--write-committed: {error}")
    for path in changed:
        print(f"rewrote {path.relative_to(ROOT)}")
    if not changed:
        print("the committed configs are as declared")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="folder to write model_repository/ and ensembles/ into")
    parser.add_argument("--write-committed", action="store_true",
                        help="instead of a deployment: rewrite the committed config.pbtxt files' generated tensors "
                             "from their declarations (src/tritonfront/core/trtllm_contract.py, llmapi_contract.py)")
    parser.add_argument("--dp", type=count, help="llm instances = data-parallel ranks (CPU)")
    parser.add_argument("--gpus", type=gpu_list, help="e.g. 0,1: encoder on these GPUs, one llm DP rank per GPU")
    parser.add_argument("--engine", choices=PARAMETERS["llm"]["engine"].choices,
                        help=f"llm engine (committed: {COMMITTED_ENGINE}; with --gpus: {GPU_DEFAULT_ENGINE})")
    parser.add_argument("--detokenizers", type=count, help="detokenizer instance count")
    parser.add_argument("--tokenizers", type=count, help="tokenizer and llm_tokenizer instance count")
    parser.add_argument("--encoders", type=count, help="encoder instance count (CPU)")
    parser.add_argument("--poolers", type=count, help="pooler instance count")
    parser.add_argument("--llmapi-decoupled", action="store_true",
                        help=f"serve TensorRT-LLM's LLM-API contract decoupled under its name {LLMAPI_MODEL} (streams "
                             f"over gRPC, no unary infer), as decoupled: True in NVIDIA's model.yaml; by default "
                             f"{LLMAPI_MODEL} is not decoupled and {DECOUPLED_MODEL_NAME} streams")
    parser.add_argument("--set", action="append", default=[], metavar="MODEL.PARAM=VALUE",
                        help="override a config.pbtxt parameter, e.g. llm.balancing=none (checked against the "
                             "model's typed config: tritonfront/core/model_config.py)")
    parser.add_argument("--queue", action="append", default=[], metavar="MODEL=SIZE[:TIMEOUT_MS]",
                        help="queue policy: requests beyond SIZE are rejected at once, and one waiting "
                             "longer than TIMEOUT_MS is rejected; size it from the measured capacity "
                             "(perf/bench_overload.py) times the longest acceptable wait")
    parser.add_argument("--queue-delay", action="append", default=[], metavar="MODEL=MICROSECONDS",
                        help="the dynamic batcher's max_queue_delay_microseconds: how long the first queued "
                             "request waits for others to join its batch (perf/bench_bursts.py measures "
                             "what it buys and costs); 0 for the llm when it has several ranks")
    args = parser.parse_args(argv)
    if args.write_committed:
        write_committed(parser, args)
        return
    if not args.out:
        parser.error("the following arguments are required: --out (or --write-committed)")
    if args.gpus and args.dp:
        parser.error("--dp is the number of GPUs when --gpus is given")
    check_overrides(parser, args.set)
    check_queues(parser, args.queue)
    check_queue_delays(parser, args.queue_delay)
    try:
        built = build(args)
    except DelayConflict as conflict:
        parser.error(str(conflict))
    out = write(Path(args.out), built)
    print(f'TRITONFRONT_REPOSITORIES="{out}/model_repository:{out}/ensembles"')


if __name__ == "__main__":
    sys.exit(main())
