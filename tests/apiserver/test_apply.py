"""Server-side apply: the scenarios kubectl drives against a real cluster.

Each test follows what `kubectl apply --server-side` (manager "kubectl"), other field
managers, `--force-conflicts` and client-side `kubectl apply` (an Update by
"kubectl-client-side-apply" that writes the last-applied annotation) produce.
"""

from __future__ import annotations

import copy

import pytest

from socialweb_computer.api.errors import StatusError
from socialweb_computer.apiserver import managedfields as mf
from socialweb_computer.apiserver import schemas
from socialweb_computer.apiserver.patching import apply as ssa

T0, T1, T2, T3 = (f"2024-05-01T10:00:0{i}Z" for i in range(4))
CM = schemas.for_kind("", "v1", "ConfigMap")
DEPLOYMENT = schemas.for_kind("apps", "v1", "Deployment")
LAST_APPLIED = mf.LAST_APPLIED_ANNOTATION


def configmap(data: dict | None, **meta) -> dict:
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": "default", **meta},
    }
    if data is not None:
        obj["data"] = data
    return obj


def apply_cm(
    live: dict | None, config: dict, manager: str = "kubectl", now: str = T0, force: bool = False
) -> dict:
    return ssa.apply(
        live, config, manager=manager, force=force, api_version="v1", now=now, schema=CM, kind="ConfigMap"
    )


def deployment(containers: list[dict], **spec) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {**spec, "template": {"spec": {"containers": containers}}},
    }


def apply_deploy(live: dict | None, config: dict, manager: str, now: str = T0, force: bool = False) -> dict:
    return ssa.apply(
        live,
        config,
        manager=manager,
        force=force,
        api_version="apps/v1",
        now=now,
        schema=DEPLOYMENT,
        kind="Deployment",
        reset_fields=["status"],
    )


def owned(obj: dict) -> dict[str, dict]:
    return {e["manager"]: e["fieldsV1"] for e in obj["metadata"].get("managedFields", [])}


def status_of(call) -> dict:
    with pytest.raises(StatusError) as info:
        call()
    return info.value.to_status()


# --- apply to a ConfigMap --------------------------------------------------------


def test_create_by_apply_records_an_apply_entry():
    obj = apply_cm(None, configmap({"foo": "bar"}, labels={"app": "x"}))
    assert obj["data"] == {"foo": "bar"}
    assert obj["metadata"]["managedFields"] == [
        {
            "manager": "kubectl",
            "operation": "Apply",
            "apiVersion": "v1",
            "time": T0,
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:data": {"f:foo": {}}, "f:metadata": {"f:labels": {"f:app": {}}}},
        }
    ]


def test_reapply_with_a_change_updates_value_and_time():
    live = apply_cm(None, configmap({"foo": "bar"}))
    obj = apply_cm(live, configmap({"foo": "baz", "extra": "1"}), now=T1)
    assert obj["data"] == {"foo": "baz", "extra": "1"}
    [entry] = obj["metadata"]["managedFields"]
    assert entry["time"] == T1
    assert entry["fieldsV1"] == {"f:data": {"f:extra": {}, "f:foo": {}}}


def test_reapply_without_changes_keeps_the_time():
    live = apply_cm(None, configmap({"foo": "bar"}))
    obj = apply_cm(live, configmap({"foo": "bar"}), now=T1)
    assert obj == live


def test_second_manager_changing_an_owned_field_conflicts():
    live = apply_cm(None, configmap({"foo": "bar"}))
    status = status_of(lambda: apply_cm(live, configmap({"foo": "other"}), manager="other", now=T1))
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Apply failed with 1 conflict: conflict with "kubectl": .data.foo',
        "reason": "Conflict",
        "code": 409,
        "details": {
            "causes": [
                {"reason": "FieldManagerConflict", "message": 'conflict with "kubectl"', "field": ".data.foo"}
            ]
        },
    }


def test_several_conflicts_are_listed_per_manager():
    live = apply_cm(None, configmap({"a": "1", "b": "1"}))
    live = apply_cm(live, configmap({"c": "1"}), manager="tool", now=T1)
    status = status_of(
        lambda: apply_cm(live, configmap({"a": "2", "b": "2", "c": "2"}), manager="third", now=T2)
    )
    assert status["message"] == (
        'Apply failed with 3 conflicts: conflicts with "kubectl":\n- .data.a\n- .data.b\n'
        'conflicts with "tool":\n- .data.c'
    )
    assert [c["field"] for c in status["details"]["causes"]] == [".data.a", ".data.b", ".data.c"]


def test_applying_the_same_value_shares_ownership_without_conflict():
    live = apply_cm(None, configmap({"foo": "bar"}))
    obj = apply_cm(live, configmap({"foo": "bar"}), manager="other", now=T1)
    assert owned(obj) == {"kubectl": {"f:data": {"f:foo": {}}}, "other": {"f:data": {"f:foo": {}}}}
    # The shared field survives when one owner stops applying it.
    dropped = apply_cm(obj, configmap(None), manager="kubectl", now=T2)
    assert dropped["data"] == {"foo": "bar"}
    assert owned(dropped) == {"other": {"f:data": {"f:foo": {}}}}
    # Applying an empty map owns the map itself.
    emptied = apply_cm(obj, configmap({}), manager="kubectl", now=T2)
    assert emptied["data"] == {"foo": "bar"}
    assert owned(emptied)["kubectl"] == {"f:data": {}}


def test_force_conflicts_moves_ownership():
    live = apply_cm(None, configmap({"foo": "bar", "keep": "1"}))
    obj = apply_cm(live, configmap({"foo": "forced"}), manager="other", now=T1, force=True)
    assert obj["data"] == {"foo": "forced", "keep": "1"}
    assert owned(obj) == {"kubectl": {"f:data": {"f:keep": {}}}, "other": {"f:data": {"f:foo": {}}}}


def test_field_left_out_of_the_configuration_is_removed():
    live = apply_cm(None, configmap({"foo": "bar", "gone": "x"}, labels={"a": "1", "b": "2"}))
    obj = apply_cm(live, configmap({"foo": "bar"}, labels={"a": "1"}), now=T1)
    assert obj["data"] == {"foo": "bar"}
    assert obj["metadata"]["labels"] == {"a": "1"}
    assert owned(obj) == {"kubectl": {"f:data": {"f:foo": {}}, "f:metadata": {"f:labels": {"f:a": {}}}}}
    emptied = apply_cm(obj, configmap(None), now=T2)
    assert "data" not in emptied and "labels" not in emptied["metadata"]


def test_fields_owned_by_an_updater_are_not_removed():
    live = apply_cm(None, configmap({"foo": "bar"}))
    edited = copy.deepcopy(live)
    edited["data"]["edited"] = "yes"
    mf.update(live, edited, manager="kubectl-edit", api_version="v1", now=T1, schema=CM)
    obj = apply_cm(edited, configmap({"foo": "bar2"}), now=T2)
    assert obj["data"] == {"foo": "bar2", "edited": "yes"}


def test_sets_are_unioned_across_managers():
    live = apply_cm(None, configmap(None, finalizers=["a.example/x"]))
    obj = apply_cm(live, configmap(None, finalizers=["b.example/y"]), manager="other", now=T1)
    assert obj["metadata"]["finalizers"] == ["a.example/x", "b.example/y"]
    assert owned(obj)["other"] == {"f:metadata": {"f:finalizers": {'v:"b.example/y"': {}}}}


# --- lists merged by key ------------------------------------------------------------


def test_deployment_containers_merge_by_name_across_managers():
    app = {"name": "app", "image": "app:1", "ports": [{"containerPort": 8080}]}
    live = apply_deploy(None, deployment([app], replicas=2), "kubectl")
    sidecar = {"name": "sidecar", "image": "proxy:1"}
    obj = apply_deploy(live, deployment([sidecar]), "mesh-injector", now=T1)
    assert [c["name"] for c in obj["spec"]["template"]["spec"]["containers"]] == ["app", "sidecar"]
    assert obj["spec"]["replicas"] == 2
    assert owned(obj)["kubectl"]["f:spec"]["f:template"]["f:spec"]["f:containers"] == {
        'k:{"name":"app"}': {
            ".": {},
            "f:image": {},
            "f:name": {},
            "f:ports": {'k:{"containerPort":8080,"protocol":"TCP"}': {".": {}, "f:containerPort": {}}},
        }
    }

    # Changing a field of the other manager's item conflicts, naming the item by its key.
    status = status_of(
        lambda: apply_deploy(
            obj, deployment([app, {"name": "sidecar", "image": "proxy:2"}]), "kubectl", now=T2
        )
    )
    assert status["message"] == (
        'Apply failed with 1 conflict: conflict with "mesh-injector": '
        '.spec.template.spec.containers[name="sidecar"].image'
    )

    # Dropping its own item removes it and leaves the other manager's alone.
    renamed = apply_deploy(
        obj, deployment([{"name": "app2", "image": "app:2"}], replicas=2), "kubectl", now=T3
    )
    containers = renamed["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["sidecar", "app2"]


def test_config_order_wins_for_shared_items():
    live = apply_deploy(
        None, deployment([{"name": "a", "image": "a"}, {"name": "b", "image": "b"}]), "kubectl"
    )
    obj = apply_deploy(
        live, deployment([{"name": "b", "image": "b"}, {"name": "a", "image": "a"}]), "kubectl", now=T1
    )
    assert [c["name"] for c in obj["spec"]["template"]["spec"]["containers"]] == ["b", "a"]


def test_atomic_lists_are_replaced():
    live = apply_deploy(None, deployment([{"name": "a", "image": "a", "args": ["1", "2"]}]), "kubectl")
    obj = apply_deploy(live, deployment([{"name": "a", "image": "a", "args": ["3"]}]), "kubectl", now=T1)
    assert obj["spec"]["template"]["spec"]["containers"][0]["args"] == ["3"]


def test_status_in_the_configuration_is_not_owned_on_the_main_resource():
    config = deployment([{"name": "a", "image": "a"}])
    config["status"] = {"replicas": 9}
    obj = apply_deploy(None, config, "kubectl")
    assert "f:status" not in owned(obj)["kubectl"]


# --- client-side apply, then server-side apply ---------------------------------------


def client_side_applied(data: dict) -> dict:
    """What `kubectl apply` (client-side) creates: an Update by kubectl-client-side-apply."""
    config = configmap(data)
    obj = copy.deepcopy(config)
    obj["metadata"]["annotations"] = {
        LAST_APPLIED: ssa.last_applied_value(
            {**config, "metadata": {**config["metadata"], "annotations": {}}}
        )
    }
    mf.update(None, obj, manager="kubectl-client-side-apply", api_version="v1", now=T0, schema=CM)
    return obj


def test_client_side_apply_entry_looks_like_a_real_cluster():
    obj = client_side_applied({"foo": "bar"})
    assert obj["metadata"]["annotations"][LAST_APPLIED] == (
        '{"apiVersion":"v1","data":{"foo":"bar"},"kind":"ConfigMap",'
        '"metadata":{"annotations":{},"name":"cfg","namespace":"default"}}\n'
    )
    assert owned(obj) == {
        "kubectl-client-side-apply": {
            "f:data": {".": {}, "f:foo": {}},
            "f:metadata": {"f:annotations": {".": {}, "f:" + LAST_APPLIED: {}}},
        }
    }


def test_kubectl_server_side_apply_takes_over_from_client_side_apply():
    live = client_side_applied({"foo": "bar"})
    obj = apply_cm(live, configmap({"foo": "baz"}), now=T1)
    assert obj["data"] == {"foo": "baz"}
    assert owned(obj) == {
        "kubectl": {"f:data": {"f:foo": {}}},
        "kubectl-client-side-apply": {
            "f:data": {},
            "f:metadata": {"f:annotations": {".": {}, "f:" + LAST_APPLIED: {}}},
        },
    }
    # The client-side annotation is kept in step with what was applied.
    assert obj["metadata"]["annotations"][LAST_APPLIED] == (
        '{"apiVersion":"v1","data":{"foo":"baz"},"kind":"ConfigMap","metadata":{"name":"cfg","namespace":"default"}}\n'
    )


def test_other_manager_after_client_side_apply_conflicts():
    live = client_side_applied({"foo": "bar"})
    status = status_of(lambda: apply_cm(live, configmap({"foo": "baz"}), manager="helm", now=T1))
    assert status["message"] == (
        'Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using v1: .data.foo'
    )
    assert status["details"]["causes"] == [
        {
            "reason": "FieldManagerConflict",
            "message": 'conflict with "kubectl-client-side-apply" using v1',
            "field": ".data.foo",
        }
    ]


def test_kubectl_conflicts_when_live_drifted_from_last_applied():
    live = client_side_applied({"foo": "bar"})
    edited = copy.deepcopy(live)
    edited["data"]["foo"] = "edited"
    mf.update(live, edited, manager="kubectl-edit", api_version="v1", now=T1, schema=CM)
    status = status_of(lambda: apply_cm(edited, configmap({"foo": "baz"}), now=T2))
    assert (
        status["message"] == 'Apply failed with 1 conflict: conflict with "kubectl-edit" using v1: .data.foo'
    )


def test_objects_nobody_owns_are_attributed_to_before_first_apply():
    live = configmap({"old": "1"}, uid="u1", resourceVersion="3")
    obj = apply_cm(live, configmap({"new": "2"}), now=T1)
    assert obj["data"] == {"old": "1", "new": "2"}
    assert owned(obj) == {
        "kubectl": {"f:data": {"f:new": {}}},
        "before-first-apply": {"f:data": {".": {}, "f:old": {}}},
    }


# --- custom resources --------------------------------------------------------------

WIDGET_SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "size": {"type": "integer"},
                "items": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["id"],
                    "items": {
                        "type": "object",
                        "required": ["id"],
                        "properties": {"id": {"type": "string"}, "v": {"type": "string"}},
                    },
                },
            },
        },
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
}


def widget(spec: dict) -> dict:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "namespace": "default"},
        "spec": spec,
    }


def apply_widget(live: dict | None, config: dict, manager: str = "kubectl", now: str = T0) -> dict:
    return ssa.apply(
        live,
        config,
        manager=manager,
        force=False,
        api_version="example.com/v1",
        now=now,
        schema=WIDGET_SCHEMA,
        kind="Widget",
    )


def test_custom_resource_apply_merges_map_lists():
    live = apply_widget(None, widget({"size": 1, "items": [{"id": "a", "v": "1"}]}))
    obj = apply_widget(live, widget({"items": [{"id": "b", "v": "2"}]}), manager="other", now=T1)
    assert obj["spec"] == {"size": 1, "items": [{"id": "a", "v": "1"}, {"id": "b", "v": "2"}]}
    assert owned(obj)["other"] == {"f:spec": {"f:items": {'k:{"id":"b"}': {".": {}, "f:id": {}, "f:v": {}}}}}


def test_field_not_in_the_schema_is_a_bad_request_in_the_apiservers_words():
    # Upstream's words; upstream answers 500 (kubernetes/kubernetes#122480), we answer 400.
    status = status_of(lambda: apply_widget(None, widget({"bogus": 1})))
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "failed to create typed patch object (default/w; example.com/v1, Kind=Widget): "
        ".spec.bogus: field not declared in schema",
        "reason": "BadRequest",
        "code": 400,
    }


def test_map_list_item_without_its_key_is_rejected():
    status = status_of(lambda: apply_widget(None, widget({"items": [{"v": "1"}]})))
    assert status["message"].endswith(
        '.spec.items: element 0: associative list with keys has an element that omits key field "id" '
        "(and doesn't have default value)"
    )


def test_wrong_scalar_kind_is_rejected():
    status = status_of(lambda: apply_widget(None, widget({"size": "big"})))
    assert status["message"].endswith(".spec.size: expected numeric (int or float), got string")


# --- request validation ------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"apiVersion": "v1", "metadata": {"name": "cfg"}}, "invalid object type: /v1, Kind="),
        ({"kind": "ConfigMap", "metadata": {"name": "cfg"}}, "invalid object type: /, Kind=ConfigMap"),
        (
            {"apiVersion": "apps/v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}},
            "invalid object type: apps/v1, Kind=ConfigMap",
        ),
        (
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cfg"}},
            "invalid object type: /v1, Kind=Secret",
        ),
        (
            {**configmap({}), "metadata": {"name": "cfg", "managedFields": []}},
            "metadata.managedFields must be nil",
        ),
    ],
)
def test_bad_apply_bodies_are_bad_requests(config, message):
    status = status_of(lambda: apply_cm(None, config))
    assert (status["code"], status["reason"], status["message"]) == (400, "BadRequest", message)


def test_name_must_match_the_url():
    status = status_of(
        lambda: ssa.apply(
            None,
            configmap({}),
            manager="m",
            force=False,
            api_version="v1",
            now=T0,
            schema=CM,
            kind="ConfigMap",
            name="other",
        )
    )
    assert status["message"] == "the name of the object (cfg) does not match the name on the URL (other)"


def test_parse_apply_body_reads_yaml_and_json():
    yaml_body = (
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  when: 2024-01-01\n  on: yes\n"
    )
    assert ssa.parse_apply_body(yaml_body) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x"},
        "data": {"when": "2024-01-01", "true": True},
    }
    assert ssa.parse_apply_body(b'{"apiVersion":"v1","kind":"ConfigMap"}') == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
    }
    assert ssa.parse_apply_body(b"") == {}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b"- a\n- b\n",
            "error decoding YAML: error unmarshaling JSON: while decoding JSON: json: cannot unmarshal "
            "array into Go value of type map[string]interface {}",
        ),
        (b"a: b: c\n", "error decoding YAML: error converting YAML to JSON: yaml: line 1: "),
    ],
)
def test_unreadable_apply_bodies(body, message):
    status = status_of(lambda: ssa.parse_apply_body(body))
    assert status["code"] == 400 and status["reason"] == "BadRequest"
    assert status["message"].startswith(message)


def test_patch_options_validation():
    status = status_of(lambda: ssa.validate_patch_options("", force_given=False, is_apply=True))
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
        "is required for apply patch",
        "reason": "Invalid",
        "code": 422,
        "details": {
            "group": "meta.k8s.io",
            "kind": "PatchOptions",
            "causes": [
                {
                    "reason": "FieldValueRequired",
                    "message": "Required value: is required for apply patch",
                    "field": "fieldManager",
                }
            ],
        },
    }
    status = status_of(lambda: ssa.validate_patch_options("m", force_given=True, is_apply=False))
    assert status["message"] == (
        'PatchOptions.meta.k8s.io "" is invalid: force: Forbidden: may not be specified for non-apply patch'
    )
    ssa.validate_patch_options("kubectl", force_given=True, is_apply=True)
    ssa.validate_patch_options("", force_given=False, is_apply=False)
