"""``%distrain ckpt save|list|load|verify|delete|export|wait|dir|autosave|resume``: distributed checkpoints.

Thin: parse, then call :mod:`workbench.notebook.checkpoints`, which users may call from Python.
Each action takes only the flags of :data:`FLAGS`; any other is refused by name (a
flag that would be ignored is never accepted).
"""
from __future__ import annotations

from . import UsageError, command


def _int_at_least(lo: int):
    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise UsageError(f"expected a whole number, got {text!r}") from None
        if v < lo:
            raise UsageError(f"expected a number >= {lo}, got {v}")
        return v
    return conv


ACTIONS = ("save", "list", "load", "verify", "delete", "export", "wait", "dir", "autosave", "resume")
# action -> the flags it uses (argparse dest names); `--dir` goes with every action that reads checkpoints
FLAGS = {
    "save": {"dir", "tag", "async_", "model_only"},
    "list": {"dir"},
    "load": {"dir", "model_only"},
    "verify": {"dir"},
    "delete": {"dir", "keep"},
    "export": {"dir", "dtype"},
    "wait": set(),
    "dir": set(),
    "autosave": {"dir", "every", "keep", "sync", "off"},
    "resume": {"dir", "n", "setup"},
}
_SPELLING = {"async_": "--async", "model_only": "--model-only", "n": "-n"}


def _check_flags(args) -> None:
    """Refuse flags the action does not use, naming them and the actions they go with."""
    given = [d for d in ("dir", "tag", "async_", "model_only", "keep", "every", "sync", "off", "dtype", "n", "setup")
             if getattr(args, d) not in (None, False)]
    extra = [d for d in given if d not in FLAGS[args.action]]
    if extra:
        def spell(d):
            return _SPELLING.get(d, "--" + d.replace("_", "-"))

        where = "; ".join(f"{spell(d)} goes with {', '.join(a for a in ACTIONS if d in FLAGS[a])}" for d in extra)
        raise UsageError(f"`ckpt {args.action}` does not take {', '.join(spell(d) for d in extra)} ({where}); "
                         "nothing was done")
    if args.action == "autosave" and args.off and (args.every or args.keep or args.sync or args.dir):
        raise UsageError("`ckpt autosave --off` takes no other flag (--every/--keep/--sync/--dir set up an auto-save)")


def _build(p) -> None:
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("args", nargs="*", help="load/verify: latest|STEP|TAG; delete: names; export: PATH [which]; "
                                          "dir: PATH; resume: [which]")
    p.add_argument("--dir", default=None, help="checkpoint folder (default ./checkpoints, or `ckpt dir`)")
    p.add_argument("--tag", default=None, help="save: a name for this checkpoint (kept by retention)")
    p.add_argument("--async", dest="async_", action="store_true", help="save in the background")
    p.add_argument("--model-only", action="store_true", help="save/load without optimizer state")
    p.add_argument("--keep", type=_int_at_least(1), default=None, help="delete/autosave: keep the newest K auto-saves")
    p.add_argument("--every", type=_int_at_least(1), default=None, help="autosave: every N steps")
    p.add_argument("--sync", action="store_true", help="autosave: synchronous saves (default async)")
    p.add_argument("--off", action="store_true", help="autosave: turn it off")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default=None, help="export: cast floats")
    p.add_argument("--hf", action="store_true",
                   help="export: a Hugging Face folder (config.json + model.safetensors) for from_pretrained")
    p.add_argument("-n", type=_int_at_least(1), default=None, help="resume: number of ranks after restart")
    p.add_argument("--setup", default=None,
                   help="resume: notebook variable holding the setup code (a str run on every rank) "
                        "that builds the model and calls checkpoint_hooks.track(...)")


@command("ckpt", "distributed checkpoints: save [--async] [--tag T] | list | load [latest|STEP|TAG] | "
                 "verify [latest|STEP|TAG] | delete ... | export PATH | autosave --every N | resume", _build)
def _ckpt(args, shell):
    from .. import checkpoints as ck
    _check_flags(args)
    root = args.dir
    a = args.action
    if a == "save":
        _no_extra(args, 0)
        info = ck.save(tag=args.tag, async_=args.async_, root=root, with_optimizer=not args.model_only)
        print(ck.describe_save(info))
        return None
    if a == "list":
        _no_extra(args, 0)
        return ck.list(root)
    if a == "load":
        _no_extra(args, 1)
        info = ck.load(args.args[0] if args.args else "latest", root=root, model_only=args.model_only)
        print(ck.describe_load(info))
        return None
    if a == "verify":
        _no_extra(args, 1)
        info = ck.verify(args.args[0] if args.args else "latest", root=root)
        print(ck.describe_verify(info))
        return None
    if a == "delete":
        if not args.args and args.keep is None:
            raise UsageError("delete what? `%distrain ckpt delete step-00000020 mytag` or `--keep 3`")
        removed = ck.delete(args.args, root=root, keep=args.keep)
        print(f"deleted {', '.join(removed) if removed else 'nothing'}")
        return None
    if a == "export":
        if not args.args or len(args.args) > 2:
            raise UsageError("usage: %distrain ckpt export PATH.safetensors [latest|STEP|TAG]  or  "
                             "%distrain ckpt export FOLDER --hf [latest|STEP|TAG]")
        info = ck.export(args.args[0], args.args[1] if len(args.args) > 1 else "latest", root=root, dtype=args.dtype,
                         hf=args.hf)
        what = f" as a Hugging Face {info['architectures'][0] if info.get('architectures') else ''} folder" if args.hf else ""
        print(f"exported {info['tensors']} tensors ({info['params']:,} parameters, step {info['step']}){what} "
              f"to {info['path']} ({info['bytes'] / 2**20:.1f} MiB)")
        return None
    if a == "wait":
        _no_extra(args, 0)
        info = ck.wait()
        print(ck.describe_save(info) if info else "no save in flight")
        return None
    if a == "dir":
        _no_extra(args, 1)
        path = ck.set_dir(args.args[0]) if args.args else ck.get_dir()
        print(f"checkpoints go to {path}")
        return None
    if a == "autosave":
        _no_extra(args, 0)
        if args.off:
            ck.autosave(None)
            print("auto-save off")
            return None
        if args.every is None:
            raise UsageError("usage: %distrain ckpt autosave --every N [--keep K] [--sync] | --off")
        ck.autosave(args.every, keep=args.keep or 3, async_=not args.sync, root=root)
        print(f"auto-save every {args.every} steps, keeping the newest {args.keep or 3} "
              f"({'sync' if args.sync else 'async'}) in {ck.get_dir(root)}")
        return None
    if a == "resume":
        _no_extra(args, 1)
        info = ck.resume(setup=setup_from(args.setup, shell), which=args.args[0] if args.args else "latest", n=args.n, root=root)
        print(ck.describe_load(info))
        return None
    raise UsageError(f"unknown action {a!r}")  # pragma: no cover


def _no_extra(args, most: int) -> None:
    if len(args.args) > most:
        raise UsageError(f"`ckpt {args.action}` takes at most {most} name(s), got {' '.join(args.args)}")


def setup_from(name: str | None, shell):
    """The setup code (or function) in notebook variable ``name``; None without a name."""
    if not name:
        return None
    ns = shell.user_ns if shell is not None else {}
    if name not in ns:
        raise UsageError(f"no notebook variable named {name!r}: put the setup cell's code in it")
    return ns[name]
