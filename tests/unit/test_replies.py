"""The typed replies of the rank requests: every request names its reply, a class of
``workbench.shared.replies``, plain data, or None (it only acts), and the dicts the public API
returns keep their keys through a reply."""

import dataclasses
import inspect
import typing

import pytest

from workbench.engine import rpc
from workbench.shared import replies

pytestmark = pytest.mark.pure

ACTS_ONLY = {
    "SetAutosave",
    "CommitTrainer",
    "SetNames",
    "ConnectStream",
}  # replies None: the notebook waits for them, reads nothing
PLAIN = (dict, list, int, str, bool)  # plain data: a rank's description (rs.info), a port, an outcome
USERS_OWN = {"GetName"}  # the value of a variable the user made on the rank


def _requests():
    return [
        c
        for _, c in inspect.getmembers(rpc, inspect.isclass)
        if c.__module__ == rpc.__name__ and dataclasses.is_dataclass(c)
    ]


def test_every_request_is_frozen_and_names_its_reply():
    assert {"RunCell", "ReadLog", "SaveCheckpoint", "Prepare", "Bootstrap", "ConnectStream"} <= {
        r.__name__ for r in _requests()
    }
    for req in _requests():
        assert req.__dataclass_params__.frozen, req
        ret = typing.get_type_hints(req.run, {**vars(rpc), "replies": replies})["return"]
        if req.__name__ in ACTS_ONLY:
            assert ret is type(None), req
            continue
        if req.__name__ in USERS_OWN:
            assert ret is typing.Any, req
            continue
        kinds = typing.get_args(ret) or (ret,)
        named = [k for k in kinds if k is not type(None)]
        assert named, req
        for k in named:
            plain = k in PLAIN
            assert plain or (k.__module__ == replies.__name__ and k.__dataclass_params__.frozen), (req, k)


def test_save_info_keeps_the_keys_readers_test_for():
    background = {"name": "step-3", "step": 3, "async": True, "blocked_s": 0.01, "path": "/c/step-3"}
    info = replies.SaveInfo.from_dict(background)
    assert info.async_ is True and info.save_s is None
    assert info.to_dict() == background  # no "save_s": describe_save says "in the background"
    done = {"name": "step-3", "step": 3, "path": "/c/step-3", "async": False, "save_s": 0.2, "removed": ["step-1"]}
    assert replies.SaveInfo.from_dict(done).removed == ("step-1",)
    assert replies.SaveInfo.from_dict(done).to_dict() == done


def test_an_unknown_key_is_refused_by_name():
    with pytest.raises(TypeError, match=r"SaveInfo has no field colour \(fields: .*blocked_s"):
        replies.SaveInfo.from_dict({"name": "a", "step": 1, "path": "/p", "colour": "red"})


def test_layout_round_trip_is_the_schema_the_figures_read():
    lay = {
        "version": 1,
        "strategy": "fsdp2",
        "path": "native",
        "mesh": {"shape": [2], "dim_names": ["dp_shard"]},
        "rank": 1,
        "world_size": 2,
        "params": [{"name": "w", "global_shape": [4, 4], "local_shape": [2, 4]}],
        "param_bytes_local": 32,
        "param_bytes_global": 64,
        "notes": [],
        "data": {"dp_rank": 1, "dp_size": 2},
        "degrees": {"dp_shard": 2},
        "blocks": ["layers.0"],
    }
    reply = replies.LayoutReply.from_dict(lay)
    assert reply.params[0]["name"] == "w" and reply.blocks == ("layers.0",)
    assert reply.to_dict() == lay
    bare = {k: v for k, v in lay.items() if k not in ("degrees", "blocks")}
    assert replies.LayoutReply.from_dict(bare).to_dict() == bare
