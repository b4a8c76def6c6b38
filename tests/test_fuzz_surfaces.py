"""Hostile input to the newer surfaces, generated per class, through the command line in a
child process under the memory and CPU limits of tests/test_fuzz.py, with its checks: exit 1
with located lines only, or exit 2 with one usage line; never a traceback, never past the
limits, never a file written.

Classes: Megatron launch scripts, ``--args`` and NeMo YAML (expansion, arithmetic, orders,
sizes, the model chunks per rank, constructs the reader does not run); accelerate's config
file, launch lines and variables (sizes of every kind, shapes that are not its config);
model files and the
numbers of plan and show; resolvers and output files; and the classes of the last corpora:
TOML integers of thousands of digits, model files too large (exit 1, as any invalid file),
Megatron switches given a value, level names that differ only in case, integer options that
are not ASCII digits, and the figures of a plan at the slowest links it takes (finite, in
valid JSON).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_fuzz import LONG, SCALE, Case, check, run_batch

# --- 1. Megatron: scripts, --args and NeMo YAML ---------------------------------------------

LAUNCH = "torchrun --nproc-per-node 8 pretrain_gpt.py"
SIZE_FLAGS = [
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--expert-tensor-parallel-size",
]
#: Texts a size may be given as that are not ASCII digits, or that are too many of them.
ODD_SIZES = [
    "²",
    "٣",
    "２",  # noqa: RUF001 (a full-width digit, on purpose)
    "2.0",
    "0x2",
    "-2",
    "1e3",
    "",
    "9" * 11,
    "9" * 4000,
    "9" * 5000,
    "4294967296",
    "0",
]
CONSTRUCTS = ["$(nproc)", "`nproc`", "${X/a/b}", "${#X}", "$1", "$@", "${X:?unset}", "$((", "$("]


def script(text: str, name: str = "job.sh") -> Case:
    return Case("megatron", ["convert", "--from", "megatron", name], {name: text.encode()})


def arguments(text: str) -> Case:
    return Case("megatron", ["convert", "--from", "megatron", "--args", text])


def _bounded(case: Case, under: bool) -> Case:
    """A case that converts when its expansions stay ``under`` the bounds, refused if not."""
    case.valid, case.code = under, 0 if under else 1
    return case


def _expression(rng: random.Random, terms: int) -> str:
    parts = []
    for _ in range(terms):
        number = str(rng.randint(1, 9)) * rng.choice([1, 1, 3, 20, 400, 4000])
        parts.append(number)
        parts.append(rng.choice(["+", "*", "-", "/", "%"]))
    body = "".join(parts[:-1])
    depth = rng.choice([0, 0, 10, 2000])
    return "(" * depth + body + ")" * depth


def megatron(rng: random.Random) -> Iterator[Case]:
    for _ in range(4 * SCALE):  # a variable doubling itself: refused once past the bound
        times = rng.randint(10, 40)
        # Under the bounds of the expansions (2**20 characters, 100,000 words) the script runs,
        # its last word an argument no converter reads; past them, refused where they are.
        yield _bounded(script("A=xy\n" + "A=$A$A\n" * times + f"{LAUNCH} $A\n"), times < 18)
        array = "ARGS=(--a 1)\n" + "ARGS=(${ARGS[@]} ${ARGS[@]})\n" * times
        yield _bounded(script(array + f"{LAUNCH} ${{ARGS[@]}}\n"), times < 15)
    for count in (rng.randint(5_000, 50_000) for _ in range(2 * SCALE)):  # chains
        # ${V1}x, as $V1x would be the variable V1x, which no line sets
        body = "V0=abcdefghijklmnop\n" + "".join(f"V{i}=${{V{i - 1}}}x\n" for i in range(1, count))
        case = script(body + f"{LAUNCH} --tensor-model-parallel-size 2\n")
        case.code = 1
        yield case
    for _ in range(6 * SCALE):  # arithmetic
        terms = rng.choice([2, 50, 5_000, 20_000])
        yield script(
            f"X=$(({_expression(rng, terms)}))\n{LAUNCH} --pipeline-model-parallel-size $X\n"
        )
    yield script("X=$((" + "- " * 3000 + "1))\n" + f"{LAUNCH} --context-parallel-size $X\n")
    yield script("X=" + "$((1+" * 40_000 + f"\n{LAUNCH} --context-parallel-size $X\n")
    yield script("X=$((2/0))\n" + f"{LAUNCH} --context-parallel-size $X\n")
    for parts in (6, 1000, 100_000):  # orders
        order = "-".join(rng.choice(["tp", "cp", "ep", "dp", "pp", "xp", ""]) for _ in range(parts))
        yield script(f"{LAUNCH} --order {order}\n")
        yield arguments(f"--order {order}")
        yield script(f"model:\n  order: {order or 'x'}\n", "job.yaml")
    yield script("model:\n  order: " + "tp-" * 350_000 + "pp\n", "job.yaml")
    for _ in range(8 * SCALE):  # sizes
        flag, size = rng.choice(SIZE_FLAGS), rng.choice(ODD_SIZES)
        yield script(f"{LAUNCH} {flag} {size}\n")
        yield arguments(f"{flag} {size}")
        key = flag[2:].replace("-", "_")
        nemo = script(f"model:\n  {key}: {size or '~'}\n", "job.yaml")
        # YAML reads 0x2 as the integer 2, as NeMo's loader does, and ~ as null: the default
        nemo.may_pass = size in ("0x2", "")
        yield nemo
    for _ in range(4 * SCALE):  # the model chunks per rank, from the layers of a chunk
        layers, per_chunk = rng.choice([*ODD_SIZES, "32"]), rng.choice([*ODD_SIZES, "2"])
        pipeline = "--pipeline-model-parallel-size 4"
        chunks = f"--num-layers {layers} --num-layers-per-virtual-pipeline-stage {per_chunk}"
        nemo = (
            f"model:\n  pipeline_model_parallel_size: 4\n  num_layers: {layers or '~'}\n"
            f"  num_layers_per_virtual_pipeline_stage: {per_chunk or '~'}\n"
        )
        for case in (script(f"{LAUNCH} {pipeline} {chunks}\n"), script(nemo, "job.yaml")):
            case.may_pass = True  # 32 layers in chunks of 2, or what YAML reads as those
            yield case
    for _ in range(6 * SCALE):  # what the reader does not run
        construct, flag = rng.choice(CONSTRUCTS), rng.choice(SIZE_FLAGS)
        yield script(f"X={construct}\n{LAUNCH} {flag} $X\n")
        yield arguments(f"{flag} {construct}")
    for _ in range(6 * SCALE):  # noise in a good script
        text = list(
            f"TP=2\nPP=$((TP * 2))\n{LAUNCH} --tensor-model-parallel-size $TP \\\n  --pipeline-model-parallel-size $PP\n"
        )
        for _ in range(rng.randint(1, 4)):
            text.insert(
                rng.randrange(len(text)),
                rng.choice([*"'\"`\\$(){}[]#;|&\n", "$((", "${", "\x00"]),
            )
        case = script("".join(text))
        case.may_pass = True
        yield case
    others = (  # files of other tools, or of none, given --from megatron
        ("num_processes: 8\ndistributed_type: MULTI_GPU\n", "accelerate.yaml"),
        ("world_size: 8\ndegrees: {tp: 2}\n", "mesh.yaml"),
        ("name: run\nsteps: 10\n", "run.yml"),
        ("accelerate launch --num_processes 8 train.py\n", "job.sh"),
        ("echo start\nsleep 1\n", "job.sh"),
        ("python train.py --lr 3e-4\n", "job.sh"),
        ("", "empty.sh"),
    )
    for text, name in rng.sample(others, len(others)):
        case = script(text, name)
        case.code = 1
        yield case
    yield script("x" * (300 * 1024) + "\n")
    yield arguments("--tensor-model-parallel-size " + "2 " * 200_000)


# --- 1b. accelerate: its config file, launch lines and variables ---------------------------

ACCELERATE_KEYS = ["dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size"]
ODD_VALUES = ["true", "[2]", "{a: 1}", "2.0", "-2", "0", "~", "'2'", "9" * 4000, "1e3", "!!str 2"]


def accelerate_file(text: str, name: str = "accelerate.yaml") -> Case:
    return Case("accelerate", ["convert", "--from", "accelerate", name], {name: text.encode()})


def accelerate(rng: random.Random) -> Iterator[Case]:
    for _ in range(8 * SCALE):  # sizes of every kind, in each of the three places
        key, size = rng.choice(ACCELERATE_KEYS), rng.choice(ODD_SIZES)
        value = rng.choice(ODD_VALUES)
        yield accelerate_file(
            f"num_processes: 8\nparallelism_config:\n  parallelism_config_{key}: {value}\n"
        )
        yield accelerate_file(f"num_processes: {value}\nnum_machines: {rng.choice(ODD_VALUES)}\n")
        yield Case(
            "accelerate",
            [
                "convert",
                "--from",
                "accelerate",
                "--args",
                f"accelerate launch --parallelism_config_{key} {size} train.py",
            ],
        )
        yield accelerate_file(
            f"export PARALLELISM_CONFIG_{key.upper()}={size}\naccelerate launch train.py\n",
            "job.sh",
        )
    for _ in range(4 * SCALE):  # what the reader does not run
        construct = rng.choice(CONSTRUCTS)
        yield accelerate_file(
            f"X={construct}\naccelerate launch --num_processes $X train.py\n", "job.sh"
        )
    launch = "accelerate launch --num_processes 8 --parallelism_config_tp_size 8 train.py\n"
    for _ in range(4 * SCALE):  # here-documents, env and redirections, as bash reads them
        operators = rng.choice([1, 3, 5_000, 50_000])
        body = rng.choice(["", launch * rng.choice([1, 20_000]), "EOF\n" * operators])
        texts = [
            "cat" + " <<EOF" * operators + "\n" + body + launch,
            rng.choice(["<<", "<<-", "2>&1 >", "env -u", "env -S", "env"])
            + rng.choice(["", " 'EOF", ' "', " $((", " `"])
            + "\n"
            + launch,
            "env " + "PARALLELISM_CONFIG_TP_SIZE=2 " * rng.choice([1, 30_000]) + launch,
        ]
        for text in texts:
            case = accelerate_file(text, "job.sh")
            case.may_pass = True  # bash runs some of them: closed here-documents, env alone
            yield case
    for _ in range(4 * SCALE):  # sizes the launcher never applies, lines it refuses
        key, size = rng.choice(ACCELERATE_KEYS), rng.choice(["2", "4", "8"])
        paradigm = rng.choice(["", "--use_fsdp ", "--use_fsdp --fsdp_version 1 ", "--multi_gpu "])
        for line in (
            f"accelerate launch {paradigm}--num_processes {size} "
            f"--parallelism_config_{key} {size} train.py",
            f"accelerate launch {paradigm}--use_parallelism_config --num_processes {size} t.py",
            "accelerate launch --use_fsdp --fsdp_version 2 --use_parallelism_config="
            + rng.choice(["false", "true", "0", "", "no"])
            + " train.py",
        ):
            case = Case("accelerate", ["convert", "--from", "accelerate", "--args", line])
            case.code = 1
            yield case
        case = accelerate_file(
            f"export PARALLELISM_CONFIG_{key.upper()}={size}\naccelerate launch --use_fsdp "
            f"--fsdp_version 2 --use_parallelism_config --num_processes {size} train.py\n",
            "job.sh",
        )
        case.code = 1
        yield case
    for _ in range(2 * SCALE):  # integers written as strings, which accelerate never converts
        key, size = rng.choice(["num_processes", "num_machines"]), rng.choice(["1", "2", "8"])
        quoted = rng.choice([f"'{size}'", f'"{size}"', f"!!str {size}"])
        other = "num_machines: 1" if key == "num_processes" else "num_processes: 8"
        case = accelerate_file(f"{other}\n{key}: {quoted}\n")
        case.code = 1
        yield case
    for _ in range(2 * SCALE):  # --config_file, whose merge with the line is not reproduced
        path = rng.choice(["fsdp.yaml", "./cfg/a.yaml", "/etc/missing.yaml", "'sp ace.yaml'"])
        option = rng.choice([f"--config_file {path}", f"--config_file={path}"])
        for line in (
            f"accelerate launch {option} train.py",
            f"accelerate launch --num_processes 8 {option} --use_fsdp train.py",
        ):
            case = Case("accelerate", ["convert", "--from", "accelerate", "--args", line])
            case.code = 1
            yield case
    others = (  # files of other tools, or of none, given --from accelerate
        (
            "[parallelism]\ndata_parallel_shard_degree = -1\ntensor_parallel_degree = 2\n",
            "job.toml",
        ),
        (f"#!/bin/bash\n{LAUNCH} --tensor-model-parallel-size 2\n", "train.sh"),
        ("world_size: 8\ndegrees: {tp: 2}\n", "mesh.yaml.bak"),
        ("world_size: 8\ndegrees: {tp: 2}\n", "mesh.yaml"),
        ("model:\n  tensor_model_parallel_size: 2\n", "nemo.yaml"),
        ("", "empty.sh"),
    )
    for text, name in rng.sample(others, len(others)):
        case = accelerate_file(text, name)
        case.code = 1
        yield case
    for text in (  # shapes that are not accelerate's config
        "- 1\n- 2\n",
        "parallelism_config: 4\n",
        "fsdp_config: [1, 2]\nnum_processes: 2\n",
        "num_processes: [8\n",
        "a: &a [*a]\n",
        "num_processes: 8\n" * 3,
        "parallelism_config:\n" + "  parallelism_config_tp_size: 2\n" * 2000,
    ):
        yield accelerate_file(text)
    yield accelerate_file("x" * (5 * 1024 * 1024))
    yield accelerate_file("accelerate launch " + "--num_processes 8 " * 20_000 + "t.py\n", "job.sh")


#: Files of each source and of none, for ``convert`` without --from: text, and whether some
#: source holds it.
RECOGNITION_TEXTS = [
    ("num_processes: 8\ndistributed_type: MULTI_GPU\n", True),
    ("accelerate launch --num_processes 8 train.py\n", True),
    (f"{LAUNCH} --tensor-model-parallel-size 2\n", True),
    ("trainer:\n  devices: 8\nmodel:\n  tensor_model_parallel_size: 2\n", True),
    ("[parallelism]\ntensor_parallel_degree = 2\n", True),
    ("[distributed]\ntp = 2\n", True),
    ("world_size: 8\ndegrees: {tp: 2}\n", False),
    ("name: run\nsteps: 10\n", False),
    ("echo start\nsleep 1\n", False),
    ("- 1\n- 2\n", False),
    ("[x]\ny = 1\n", False),
    ("", False),
    ("'unclosed\n", False),
    ("cat <<EOF\naccelerate launch train.py\nEOF\n", False),
]
RECOGNITION_SUFFIXES = [".yaml", ".yml", ".json", ".sh", ".toml", "", ".bak", ".txt"]


def contradictions(rng: random.Random) -> Iterator[Case]:
    """Values that say two things: each refused (exit 2, or 1 for a file's), never one kept."""
    for _ in range(4 * SCALE):
        sizes = [rng.choice([2, 4, 8]) for _ in range(rng.choice([2, 3]))]
        levels = [word for size in sizes for word in ("--level", f"node={size}")]
        yield Case("contradictions", ["plan", "--world-size", "64", *levels], code=2)
        total, part = rng.choice(RUNTIME_OPTIONS[1:]), rng.choice(["0", "1", "3.5"])
        args = ["plan", "--world-size", "64", "--model", "llama3-8b"]
        pair = [["--runtime-gib", "2"], [total, part]]
        rng.shuffle(pair)
        yield Case("contradictions", [*args, *pair[0], *pair[1]], code=2)
        per_node = rng.choice([1, 2, 4, 16])
        processes, machines = rng.choice([(16, 2), (32, 4), (8, 1)])
        case = accelerate_file(f"num_processes: {processes}\nnum_machines: {machines}\n")
        case.argv += ["--gpus-per-node", str(per_node)]
        case.may_pass = per_node == processes // machines
        if not case.may_pass:
            case.code = 1
        yield case


def recognition(rng: random.Random) -> Iterator[Case]:
    for _ in range(8 * SCALE):
        text, held = rng.choice(RECOGNITION_TEXTS)
        name = "input" + rng.choice(RECOGNITION_SUFFIXES)
        case = Case("recognition", ["convert", name], {name: text.encode()})
        case.may_pass = held  # a source's file under another suffix may still be refused
        yield case


# --- 2. Model files and the numbers of plan and show ---------------------------------------

MODEL = """\
name: tiny
layers: 4
hidden: 256
ffn: 1024
vocab: 1000
attention: {heads: 8, kv_heads: 2}
experts: {routed: 8, top_k: 2, ffn: 512}
"""
MODEL_NUMBERS = ["layers", "hidden", "ffn", "vocab", "heads", "kv_heads", "routed", "top_k"]
HUGE_NUMBERS = ["10" * 15, "1" + "0" * 29, "9" * 400, "-1", "0", "1e30", "0x10", "²", ".inf"]
INTEGER_OPTIONS = ["--seq-len", "--micro-batch", "--global-batch-tokens", "--world-size"]
#: How the pipeline is split and which blocks are recomputed.
PIPELINE_OPTIONS = [
    "--first-stage-layers",
    "--last-stage-layers",
    "--embedding-as-layers",
    "--output-as-layers",
    "--layers-per-stage",
    "--checkpoint-every",
    "--checkpoint-first",
    "--checkpoint-group",
    "--moe-max-nodes",
]
FLOAT_OPTIONS = [
    "--mfu",
    "--peak-tflops",
    "--inter-node-gb-s",
    "--intra-node-gb-s",
    "--inter-node-gbps",
    "--intra-node-gbps",
]
#: The runtime term's GiB, which take 0 to 16384.
RUNTIME_OPTIONS = [
    "--runtime-gib",
    "--cuda-context-gib",
    "--nccl-communicator-gib",
    "--allocator-gib",
]
FLOATS = [
    "1e-300",
    "5e-324",
    "1e-320",
    "1e309",
    "nan",
    "inf",
    "-0",
    "0",
    "1e-3",
    "0x1p-3",
    "1" * 400,
]


def _runtime_gib(text: str) -> bool:
    """Whether ``text`` is a GiB figure the runtime options take: a decimal from 0 to 16384."""
    try:
        value = float(text)
    except ValueError:
        return False
    return 0 <= value <= 16384


def models(rng: random.Random) -> Iterator[Case]:
    for _ in range(10 * SCALE):  # model files with numbers past any model
        name, value = rng.choice(MODEL_NUMBERS), rng.choice(HUGE_NUMBERS)
        text = (
            "\n".join(
                line.replace(f"{name}: ", f"{name}: {value} #") if line.startswith(name) else line
                for line in MODEL.splitlines()
            )
            .replace(f"{name}: 8,", f"{name}: {value},")
            .replace(f"{name}: 2,", f"{name}: {value},")
            .replace(f"{name}: 2}}", f"{name}: {value}}}")
        )
        args = ["plan", "--world-size", str(rng.choice([8, 64, 2**20])), "--model-file", "m.yaml"]
        # YAML 1.2 reads 0x10 as 16, a number a model may have
        yield Case("model", args, {"m.yaml": text.encode()}, may_pass=value == "0x10")
    for _ in range(10 * SCALE):  # options past any machine or run
        args = ["plan", "--world-size", "64", "--model", "llama3-8b"]
        option = rng.choice(INTEGER_OPTIONS + FLOAT_OPTIONS)
        value = rng.choice(FLOATS if option in FLOAT_OPTIONS else HUGE_NUMBERS)
        if option == "--world-size":
            args[2] = value
        else:
            args += [option, value]
        yield Case("numbers", args)
        yield Case(
            "numbers",
            ["show", "c.yaml", "--model", "llama3-8b", option, value],
            {"c.yaml": b"world_size: 64\n"},
        )
    yield Case(
        "numbers",
        [
            "plan",
            "--world-size",
            "64",
            "--model",
            "llama3-8b",
            "--pp-schedule",
            "interleaved",
            "--virtual-stages",
            str(10**9),
        ],
    )
    for option in RUNTIME_OPTIONS:  # GiB past any GPU, or not numbers; 0 and up are taken
        for value in FLOATS:
            args = ["plan", "--world-size", "64", "--model", "llama3-8b", option, value]
            yield Case("numbers", args, may_pass=_runtime_gib(value))
    # each pipeline and recomputation setting at the largest value it accepts, over 2**20
    # GPUs (tp and ep pinned, which a plan of so many layouts asks for): an estimate that
    # looked at every pipeline rank would not end in time; past it, refused. End chunks of
    # more layers than the model has leave no layout it can run, which is said.
    for option in PIPELINE_OPTIONS:
        args = ["plan", "--world-size", str(2**20), "--model", "deepseek-v3", "--tp", "8"]
        args += ["--ep", "8", option]
        ends = option in ("--first-stage-layers", "--last-stage-layers")
        yield Case("numbers", [*args, "100000"], valid=not ends, code=2 if ends else None)
        for value in HUGE_NUMBERS:
            # 0 is a size some of them take
            yield Case("numbers", [*args, value], may_pass=value == "0")
    # the interleaved schedule's micro-batch groups, at the largest accepted and past it
    grouped = [
        "plan", "--world-size", str(2**20), "--model", "deepseek-v3", "--tp", "8", "--ep", "8",
        "--pp-schedule", "interleaved", "--virtual-stages", "2", "--microbatch-group",
    ]  # fmt: skip
    yield Case("numbers", [*grouped, str(2**30)], valid=True)
    for value in HUGE_NUMBERS:
        yield Case("numbers", [*grouped, value])
    # Llama 3's groups, which take any size up to the step's micro-batches
    llama3 = [word if word != "interleaved" else "llama3" for word in grouped]
    yield Case("numbers", [*llama3, str(2**30)], valid=True)
    for value in HUGE_NUMBERS:
        yield Case("numbers", [*llama3, value])
    # nor one that made a chunk for each layer the embedding counts as: no pipeline of 4096
    # GPUs at most holds those chunks, which is said
    yield Case(
        "numbers",
        [
            "plan", "--world-size", "4096", "--model", "deepseek-v3", "--embedding-as-layers",
            "100000", "--pp-schedule", "interleaved", "--layers-per-stage", "1",
        ],
        code=2,
    )  # fmt: skip
    yield Case(
        "numbers",
        [
            "plan",
            "--world-size",
            "64",
            "--model",
            "llama3-8b",
            "--peak-tflops",
            "1e-300",
            "--mfu",
            "1e-300",
        ],
    )
    for special in ("/dev/zero", "/dev/urandom", ".", "missing.yaml"):
        yield Case("model", ["plan", "--world-size", "8", "--model-file", special])
    yield Case(
        "model",
        ["plan", "--world-size", "8", "--model-file", "m.yaml"],
        {"m.yaml": b"name: x\n" + b"#" * (1 << 20)},
    )


# --- 3. Resolvers and output files -------------------------------------------------------------


def resolvers(rng: random.Random) -> Iterator[Case]:
    config = b"world_size: 8\na: 2\ndegrees:\n  tp: ${oc.decode:${oc.env:X}}\n"
    for _ in range(6 * SCALE):
        fan = rng.choice([100, 3000, 20_000])
        body = rng.choice(["${a}", "${oc.decode:${a}}", "[${a}]", "{k: ${a}}"])
        value = rng.choice(["[", ""]) + ",".join([body] * fan)
        yield Case("resolver", ["validate", "c.yaml"], {"c.yaml": config}, {"X": value})
    yield Case(
        "resolver",
        ["validate", "c.yaml"],
        {"c.yaml": config},
        {"X": "${oc.decode:" * 40 + "1" + "}" * 40},
    )
    yield Case(
        "resolver",
        ["validate", "c.yaml", "-o", "degrees.pp=${oc.decode:${oc.env:X}}"],
        {"c.yaml": b"world_size: 8\na: 2\n"},
        {"X": "${a}" * 30_000},
    )


def outputs(rng: random.Random) -> Iterator[Case]:
    for special in ("/dev/zero", "/dev/null", "."):
        yield Case("schema", ["schema", "--check", "--out", special])
        yield Case("schema", ["schema", "--out", special])
    yield Case("schema", ["schema", "--check", "--out", "big.json"], {"big.json": b" " * (2 << 20)})


# --- 4. The classes of the last corpora ----------------------------------------------------

#: Every integer option of plan, with the text of an integer that is not one in ASCII.
PLAN_INTEGERS = [
    *INTEGER_OPTIONS, *PIPELINE_OPTIONS, "--limit", "--emit", "--gpus-per-node", "--tp", "--pp",
    "--cp", "--dp-shard", "--dp-replicate", "--ep", "--etp", "--virtual-stages",
    "--moe-max-nodes", "--zero-stage",
]  # fmt: skip
ODD_DIGITS = ["٣", "२", "３", "0_3", "1_0", "²", "3.0", " ", "+3", "0x3"]  # noqa: RUF001
#: Megatron-LM's switches, which its parser takes no value for.
SWITCHES = [
    "--sequence-parallel", "--use-distributed-optimizer", "--recompute-activations",
    "--overlap-moe-expert-parallel-comm", "--account-for-embedding-in-pipeline-split",
    "--fp8-param-gather",
]  # fmt: skip


def _toml_integer(rng: random.Random, digits: int) -> str:
    number = "9" * digits
    if rng.random() < 0.3:  # underscores, as TOML allows them between digits
        number = "_".join(number[i : i + 3] for i in range(0, len(number), 3))
    form = rng.choice(["{n}", "-{n}", "+{n}", "[1, {n}]", "{{ a = {n} }}", "{n}.5", "{n}e2"])
    return form.format(n=number)


def corpora(rng: random.Random) -> Iterator[Case]:
    for _ in range(4 * SCALE):  # TOML integers past what Python writes as text
        digits = rng.choice([31, 400, 4300, 4301, 5000, 30_000])
        key = rng.choice(["tensor_parallel_degree", "pipeline_parallel_degree", "other"])
        text = f"[parallelism]\n{key} = {_toml_integer(rng, digits)}\n"
        yield Case("toml", ["convert", "t.toml"], {"t.toml": text.encode()}, code=1)
    # the same digits in a string or a comment are no number
    quiet = "[parallelism]\n# {n}\ntensor_parallel_degree = 2 # {n}\nx = \"{n}\"\ny = '{n}'\n"
    yield Case(
        "toml", ["convert", "t.toml"], {"t.toml": quiet.format(n="9" * 5000).encode()}, code=1
    )
    for size in (1 << 16, (1 << 16) + 1, 1 << 20, 10 << 20):  # model files too large
        text = b"name: x\n" + b"#" * size
        yield Case(
            "model",
            ["plan", "--world-size", "8", "--model-file", "m.yaml"],
            {"m.yaml": text},
            code=1,
        )
    for switch in SWITCHES:  # a switch with a value, which Megatron-LM's parser refuses
        value = rng.choice(["false", "true", "0", "1", "", "no"])
        yield arguments(f"--tensor-model-parallel-size 2 {switch}={value}")
    for _ in range(2 * SCALE):  # level names that read one MESHCONF_LEVEL_ variable
        name = rng.choice(["nvlink", "pod", "rack", "Node"])
        other = "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in name)
        if other == name:
            other = name.upper()
        config = f"world_size: 64\nlevels: [{{name: node, size: 4}}, {{name: {name}, size: 8}}, {{name: {other}, size: 16}}]\n"
        yield Case("levels", ["validate", "c.yaml"], {"c.yaml": config.encode()}, code=1)
        yield Case(
            "levels",
            [
                "plan",
                "--world-size",
                "64",
                "--level",
                "node=4",
                "--level",
                f"{name}=8",
                "--level",
                f"{other}=16",
            ],
            code=2,
        )
    for option in PLAN_INTEGERS:  # integers that are not ASCII digits
        value = rng.choice(ODD_DIGITS)
        args = ["plan", "--world-size", "64", "--model", "llama3-8b", option, value]
        if option == "--world-size":
            args[2:4] = []
        yield Case("digits", args, code=2)
    # the slowest links and the largest model a plan takes: every figure finite
    for bandwidth in ("0.01", "100000"):
        args = ["plan", "--world-size", "2048", "--model", "deepseek-v3", "--format", "json"]
        args += ["--level", "node=8", "--level", f"nvlink=64@{bandwidth}"]
        args += ["--inter-node-gb-s", bandwidth, "--intra-node-gb-s", bandwidth, "--tp", "8"]
        yield Case("finite", args, valid=True, strict_json=True)
        config = (
            f"world_size: 2048\nlevels: [{{name: node, size: 8, bandwidth_gb_s: {bandwidth}}}]\n"
        )
        yield Case(
            "finite",
            [
                "show",
                "c.yaml",
                "--model",
                "deepseek-v3",
                "--format",
                "json",
                "--peak-tflops",
                "0.01",
            ],
            {"c.yaml": config.encode()},
            valid=True,
            strict_json=True,
        )
    for bandwidth in ("1e-300", "0.009", "5e-324"):  # slower than any link: refused
        config = f"world_size: 64\nlevels: [{{name: node, size: 8, bandwidth_gb_s: {bandwidth}}}]\n"
        yield Case("finite", ["validate", "c.yaml"], {"c.yaml": config.encode()}, code=1)


@pytest.mark.timeout(600 if LONG else 240, method="thread")
@pytest.mark.parametrize(
    "surface",
    [megatron, accelerate, recognition, contradictions, models, resolvers, outputs, corpora],
)
def test_hostile_input_to_each_surface(tmp_path: Path, surface: object) -> None:
    cases = list(surface(random.Random(f"{surface.__name__}")))  # type: ignore[operator]
    failures = []
    for case, outcome in run_batch(cases, tmp_path):
        try:
            check(case, outcome)
        except AssertionError as error:
            failures.append(str(error))
    assert not failures, "\n\n".join(failures[:10]) + f"\n\n{len(failures)} of {len(cases)} failed"
