"""``%distrain ckpt save|load|list|verify|delete|export|wait|dir|autosave``: distributed checkpoints.

Thin: parse, then call :mod:`workbench.notebook.checkpoints`, which users may call from Python.
Each action has a parser of its own (:data:`ACTIONS`): a flag of another action is
refused naming the actions that take it (a flag that would be ignored is never accepted).
"""

from __future__ import annotations

import shlex

from ...shared.argtypes import positive_int
from . import flags
from .registry import UsageError, command


def _dir(p) -> None:
    flags.DIR.add(p, help="the checkpoint folder (default: the session's, see `ckpt dir`)")


def _which(p) -> None:
    p.add_argument("which", nargs="?", default="latest", help="latest (default), a step number or a tag")


def _save_args(p) -> None:
    _dir(p)
    p.add_argument("--tag", default=None, metavar="NAME", help="a name for this checkpoint (kept by retention)")
    flags.ASYNC.add(p)
    flags.MODEL_ONLY.add(p, help="the model's state only, without the optimizer's")
    flags.SESSION.add(p)


def _load_args(p) -> None:
    _which(p)
    _dir(p)
    flags.MODEL_ONLY.add(p, help="the model's state only (the optimizer stays as it is)")
    flags.SESSION.add(p)


def _verify_args(p) -> None:
    _which(p)
    _dir(p)


def _delete_args(p) -> None:
    p.add_argument("names", nargs="*", help="checkpoints to delete (step-00000020, a tag)")
    _dir(p)
    flags.KEEP.add(p, help="delete all but the newest K auto-saves")


def _export_args(p) -> None:
    p.add_argument("path", help="a .safetensors file, or a folder with --hf")
    _which(p)
    _dir(p)
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default=None, help="cast floats")
    p.add_argument(
        "--hf",
        action="store_true",
        help="a Hugging Face folder (config.json + model.safetensors) for from_pretrained; "
        "a peft adapter's checkpoint: adapter_config.json + adapter_model.safetensors",
    )
    p.add_argument(
        "--merged", action="store_true", help="a peft adapter's checkpoint merged into its base (for from_pretrained)"
    )


def _dir_args(p) -> None:
    p.add_argument("path", nargs="?", default=None, help="where checkpoints go from now on (none: show it)")


def _wait_args(p) -> None:
    flags.SESSION.add(p)


def _autosave_args(p) -> None:
    _dir(p)
    p.add_argument("--every", type=positive_int, default=None, help="save every N steps")
    flags.KEEP.add(p, help="keep the newest K auto-saves (default 3)")
    flags.ASYNC.add(p, help="write each save in the background (default: training waits until it is written)")
    p.add_argument("--off", action="store_true", help="turn auto-save off")
    flags.SESSION.add(p)
    p.was("--sync", None, "auto-saves return once written unless `--async` is given, as `ckpt save` does")


def _earlier_resume(words: list[str]) -> str:
    """The refusal of the earlier action ``resume`` (its checkpoint, --dir, -n, --setup), as the restart that does it now."""
    which = words[0] if words and not words[0].startswith("-") else None
    rest = words[1:] if which is not None else words
    line = shlex.join(["restart", *rest[:], "--load", *([which] if which else [])])
    return f"`ckpt resume` is now `restart --load [WHICH]` (the one way back from a checkpoint): `%distrain {line}`; nothing was run"


ACTIONS = {
    "save": ("save the ranks' model, optimizer and trainer state", _save_args),
    "load": ("load a checkpoint into the live ranks", _load_args),
    "list": ("the checkpoints in the folder", _dir),
    "verify": ("check a checkpoint's files against their checksums (no ranks needed)", _verify_args),
    "delete": ("delete checkpoints by name, or all but the newest K auto-saves", _delete_args),
    "export": ("the model's weights as one safetensors file or a Hugging Face folder", _export_args),
    "wait": ("wait for the save in flight", _wait_args),
    "dir": ("show or set the checkpoint folder", _dir_args),
    "autosave": ("save every N steps while training (--off to stop)", _autosave_args),
}


@command(
    "ckpt",
    "checkpoints: save | load | list | verify | delete | export | wait | dir | autosave",
    actions=ACTIONS,
    earlier_actions={"resume": _earlier_resume},
)
def _ckpt(args, shell):
    from .. import checkpoints as ck

    a = args.action
    if a == "save":
        info = ck.save(tag=args.tag, async_=args.async_, root=args.dir, with_optimizer=not args.model_only)
        print(ck.describe_save(info))
        return None
    if a == "list":
        return ck.list(args.dir)
    if a == "load":
        info = ck.load(args.which, root=args.dir, model_only=args.model_only)
        print(ck.describe_load(info))
        return None
    if a == "verify":
        info = ck.verify(args.which, root=args.dir)
        print(ck.describe_verify(info))
        return None
    if a == "delete":
        if not args.names and args.keep is None:
            raise UsageError("delete what? `%distrain ckpt delete step-00000020 mytag` or `--keep 3`")
        removed = ck.delete(args.names, root=args.dir, keep=args.keep)
        print(f"deleted {', '.join(removed) if removed else 'nothing'}")
        return None
    if a == "export":
        info = ck.export(args.path, args.which, root=args.dir, dtype=args.dtype, hf=args.hf, merged=args.merged)
        arch = info["architectures"][0] if info.get("architectures") else ""
        what = ""
        if info.get("names", "").startswith("peft"):
            what = f" as a {info['names']} folder (for PeftModel.from_pretrained on a {arch})"
        elif args.hf or args.merged:
            what = f" as a Hugging Face {arch} folder" + (" (adapter merged into its base)" if args.merged else "")
        print(
            f"exported {info['tensors']} tensors ({info['params']:,} parameters, step {info['step']}){what} "
            f"to {info['path']} ({info['bytes'] / 2**20:.1f} MiB)"
        )
        return None
    if a == "wait":
        info = ck.wait()
        print(ck.describe_save(info) if info else "no save in flight")
        return None
    if a == "dir":
        path = ck.set_dir(args.path) if args.path else ck.get_dir()
        print(f"checkpoints go to {path}")
        return None
    if a == "autosave":
        if args.off:
            if args.every or args.keep or args.async_ or args.dir:
                raise UsageError(
                    "`ckpt autosave --off` takes no other flag (--every/--keep/--async/--dir set up an auto-save)"
                )
            ck.autosave(None)
            print("auto-save off")
            return None
        if args.every is None:
            raise UsageError("usage: %distrain ckpt autosave --every N [--keep K] [--async] [--dir PATH] | --off")
        ck.autosave(args.every, keep=args.keep or 3, async_=args.async_, root=args.dir)
        print(
            f"auto-save every {args.every} steps, keeping the newest {args.keep or 3} "
            f"({'in the background' if args.async_ else 'each written before training goes on'}) in {ck.get_dir(args.dir)}"
        )
        return None
    raise UsageError(f"unknown action {a!r}")  # pragma: no cover
