"""``%distrain ckpt save|list|load|verify|delete|export|wait|dir|autosave|resume``: distributed checkpoints.

Thin: parse, then call :mod:`workbench.notebook.checkpoints`, which users may call from Python.
Each action has a parser of its own (:data:`ACTIONS`): a flag of another action is
refused naming the actions that take it (a flag that would be ignored is never accepted).
"""

from __future__ import annotations

from ...shared.argtypes import positive_int
from . import UsageError, command


def _dir(p) -> None:
    p.add_argument("--dir", default=None, help="checkpoint folder (default ./checkpoints, or `ckpt dir`)")


def _which(p) -> None:
    p.add_argument("which", nargs="?", default="latest", help="latest (default), a step number or a tag")


def _save_args(p) -> None:
    _dir(p)
    p.add_argument("--tag", default=None, help="a name for this checkpoint (kept by retention)")
    p.add_argument("--async", dest="async_", action="store_true", help="write in the background")
    p.add_argument("--model-only", action="store_true", help="without optimizer state")


def _load_args(p) -> None:
    _which(p)
    _dir(p)
    p.add_argument("--model-only", action="store_true", help="only the model (keep the optimizer as it is)")


def _verify_args(p) -> None:
    _which(p)
    _dir(p)


def _delete_args(p) -> None:
    p.add_argument("names", nargs="*", help="checkpoints to delete (step-00000020, a tag)")
    _dir(p)
    p.add_argument("--keep", type=positive_int, default=None, help="delete all but the newest K auto-saves")


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


def _autosave_args(p) -> None:
    _dir(p)
    p.add_argument("--every", type=positive_int, default=None, help="save every N steps")
    p.add_argument("--keep", type=positive_int, default=None, help="keep the newest K auto-saves (default 3)")
    p.add_argument("--sync", action="store_true", help="synchronous saves (default async)")
    p.add_argument("--off", action="store_true", help="turn auto-save off")


def _resume_args(p) -> None:
    _which(p)
    _dir(p)
    p.add_argument("-n", type=positive_int, default=None, help="number of ranks after the restart")
    p.add_argument(
        "--setup",
        default=None,
        help="notebook variable holding the setup code (a str run on every rank) "
        "that builds the model and calls checkpoint_hooks.track(...)",
    )


ACTIONS = {
    "save": ("save the ranks' model, optimizer and trainer state", _save_args),
    "list": ("the checkpoints in the folder", _dir),
    "load": ("load a checkpoint into the live ranks", _load_args),
    "verify": ("check a checkpoint's files against their checksums (no ranks needed)", _verify_args),
    "delete": ("delete checkpoints by name, or all but the newest K auto-saves", _delete_args),
    "export": ("write the model's weights as one safetensors file or a Hugging Face folder", _export_args),
    "wait": ("wait for the save in flight", None),
    "dir": ("show or set the checkpoint folder", _dir_args),
    "autosave": ("save every N steps while training (--off to stop)", _autosave_args),
    "resume": ("restart the ranks, rebuild the model and load a checkpoint", _resume_args),
}


@command(
    "ckpt",
    "distributed checkpoints: save | list | load | verify | delete | export | wait | dir | autosave | resume",
    actions=ACTIONS,
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
            if args.every or args.keep or args.sync or args.dir:
                raise UsageError(
                    "`ckpt autosave --off` takes no other flag (--every/--keep/--sync/--dir set up an auto-save)"
                )
            ck.autosave(None)
            print("auto-save off")
            return None
        if args.every is None:
            raise UsageError("usage: %distrain ckpt autosave --every N [--keep K] [--sync] [--dir D] | --off")
        ck.autosave(args.every, keep=args.keep or 3, async_=not args.sync, root=args.dir)
        print(
            f"auto-save every {args.every} steps, keeping the newest {args.keep or 3} "
            f"({'sync' if args.sync else 'async'}) in {ck.get_dir(args.dir)}"
        )
        return None
    if a == "resume":
        from ..runs.resume import resume

        info = resume(setup=setup_from(args.setup, shell), which=args.which, n=args.n, root=args.dir)
        print(ck.describe_load(info))
        return None
    raise UsageError(f"unknown action {a!r}")  # pragma: no cover


def setup_from(name: str | None, shell):
    """The setup code (or function) in notebook variable ``name``; None without a name."""
    if not name:
        return None
    ns = shell.user_ns if shell is not None else {}
    if name not in ns:
        raise UsageError(f"no notebook variable named {name!r}: put the setup cell's code in it")
    return ns[name]
