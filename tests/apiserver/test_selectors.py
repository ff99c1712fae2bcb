"""Label and field selectors: parsing, the real server's error wording, matching, field tables."""

from __future__ import annotations

import pytest

from socialweb_computer.api import errors
from socialweb_computer.apiserver import selectors

QUALIFIED = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
             "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation "
             "is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


@pytest.mark.parametrize(("text", "canonical"), [
    ("", ""),
    ("   ", ""),
    ("app=web", "app=web"),
    ("app==web", "app==web"),
    ("tier!=db,app=web", "app=web,tier!=db"),
    ("app", "app"),
    ("!app", "!app"),
    ("app in (b, a)", "app in (a,b)"),
    ("x in (foo,,baz),y,z notin ()", "x in (,baz,foo),y,z notin ()"),
    ("app=", "app="),
    ("in in (in)", "in in (in)"),  # `in` is a word where a key or value is expected
    ("n>5,m<2", "m<2,n>5"),
    ("example.com/role=db", "example.com/role=db"),
])
def test_parse_canonical_form(text: str, canonical: str) -> None:
    assert str(selectors.parse_label_selector(text)) == canonical


@pytest.mark.parametrize(("text", "message"), [
    ("a b", "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"),
    ("a in (b c)", "unable to parse requirement: found 'c', expected: ',' or ')'"),
    ("a in b", "unable to parse requirement: found 'b' expected: '('"),
    ("a in (x", "unable to parse requirement: found '', expected: ',' or ')'"),
    ("a=(", "unable to parse requirement: found '(', expected: identifier"),
    ("a,", "found '', expected: identifier after ','"),
    (",a", "found ',', expected: !, identifier, or 'end of string'"),
    ("a=b=c", "found '=', expected: ',' or 'end of string'"),
    ("a=b c", "found 'c', expected: ',' or 'end of string'"),
    ("!a=b", "found '=', expected: ',' or 'end of string'"),
    ("-a=b", f'unable to parse requirement: <nil>: Invalid value: "-a": name part {QUALIFIED}'),
    ("a>x", 'unable to parse requirement: values[0]: Invalid value: "x": '
            "for 'Gt', 'Lt' operators, the value must be an integer"),
    ("a=b_", 'unable to parse requirement: values[0][a]: Invalid value: "b_": a valid label must be an empty '
             "string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
             "alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation "
             "is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"),
    ("a=" + "x" * 64, f'unable to parse requirement: values[0][a]: Invalid value: "{"x" * 64}": '
                      "must be no more than 63 characters"),
    ("/a", 'unable to parse requirement: <nil>: Invalid value: "/a": prefix part must be non-empty'),
    # Gt/Lt values must also be valid label values, so negative numbers are refused.
    ("n>-2", 'unable to parse requirement: values[0][n]: Invalid value: "-2": a valid label must be an empty '
             "string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
             "alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation "
             "is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"),
])
def test_parse_errors_are_400_with_the_server_wording(text: str, message: str) -> None:
    with pytest.raises(errors.StatusError) as caught:
        selectors.parse_label_selector(text)
    assert caught.value.code == 400
    assert caught.value.reason == "BadRequest"
    assert caught.value.message == message


def test_prefix_must_be_a_dns_subdomain() -> None:
    with pytest.raises(selectors.SelectorError) as caught:
        selectors.parse_label_selector_or_error("Example.com/a")
    assert str(caught.value).startswith('unable to parse requirement: <nil>: Invalid value: "Example.com/a": '
                                        "prefix part a lowercase RFC 1123 subdomain")


@pytest.mark.parametrize(("text", "labels", "expected"), [
    ("app=web", {"app": "web"}, True),
    ("app=web", {"app": "db"}, False),
    ("app=web", {}, False),
    ("app!=web", {}, True),
    ("app!=web", {"app": "web"}, False),
    ("app in (a,b)", {"app": "b"}, True),
    ("app notin (a,b)", {}, True),
    ("app notin (a,b)", {"app": "a"}, False),
    ("app", {"app": ""}, True),
    ("!app", {"app": ""}, False),
    ("app=", {"app": ""}, True),
    ("n>5", {"n": "6"}, True),
    ("n>5", {"n": "5"}, False),
    ("n>5", {"n": "six"}, False),
    ("n<5", {}, False),
    ("a=1,b=2", {"a": "1", "b": "2"}, True),
    ("a=1,b=2", {"a": "1"}, False),
    ("", {"anything": "x"}, True),
])
def test_matches(text: str, labels: dict[str, str], expected: bool) -> None:
    assert selectors.parse_label_selector(text).matches(labels) is expected


def test_label_selector_objects() -> None:
    sel = selectors.from_label_selector_object({
        "matchLabels": {"b": "2", "a": "1"},
        "matchExpressions": [{"key": "c", "operator": "In", "values": ["z", "y"]},
                             {"key": "d", "operator": "DoesNotExist"}],
    })
    assert str(sel) == "a=1,b=2,c in (y,z),!d"
    assert sel.matches({"a": "1", "b": "2", "c": "y"})
    assert not sel.matches({"a": "1", "b": "2", "c": "y", "d": ""})
    assert sel.requires_exact_match("a") == "1"
    assert sel.requires_exact_match("c") is None


def test_empty_and_nil_label_selector_objects() -> None:
    assert selectors.from_label_selector_object({}).matches({"x": "y"})
    assert selectors.from_label_selector_object({"matchLabels": {}}).empty
    assert not selectors.from_label_selector_object(None).matches({})
    assert not selectors.from_label_selector_object(None).matches({"x": "y"})


def test_label_selector_object_errors() -> None:
    with pytest.raises(selectors.SelectorError, match=r'^"Bogus" is not a valid label selector operator$'):
        selectors.from_label_selector_object({"matchExpressions": [{"key": "a", "operator": "Bogus"}]})
    with pytest.raises(selectors.SelectorError) as caught:
        selectors.from_label_selector_object({"matchExpressions": [{"key": "a", "operator": "In"}]})
    assert str(caught.value) == ("values: Invalid value: []string{}: for 'in', 'notin' operators, "
                                 "values set can't be empty")
    with pytest.raises(selectors.SelectorError) as caught:
        selectors.from_label_selector_object(
            {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]})
    assert "values set must be empty for exists and does not exist" in str(caught.value)


def test_format_helpers() -> None:
    assert selectors.format_labels({"b": "2", "a": "1"}) == "a=1,b=2"
    assert selectors.format_labels({}) == "<none>"
    assert selectors.format_label_selector(None) == "<none>"
    assert selectors.format_label_selector({}) == "<none>"
    assert selectors.format_label_selector({"matchLabels": {"app": "web"}}) == "app=web"
    assert selectors.format_label_selector({"matchExpressions": [{"key": "a", "operator": "X"}]}) == "<error>"


# --------------------------------------------------------------------------- field selectors


@pytest.mark.parametrize(("text", "canonical"), [
    ("", ""),
    ("metadata.name=web", "metadata.name=web"),
    ("status.phase!=Running,spec.nodeName==n1", "spec.nodeName=n1,status.phase!=Running"),
    (r"metadata.name=a\,b", r"metadata.name=a\,b"),
    (r"metadata.name=a\=b\\c", r"metadata.name=a\=b\\c"),
    ("metadata.name=", "metadata.name="),
    (",metadata.name=x,", "metadata.name=x"),
])
def test_field_selector_canonical_form(text: str, canonical: str) -> None:
    assert str(selectors.parse_field_selector(text)) == canonical


def test_field_selector_values_are_unescaped() -> None:
    sel = selectors.parse_field_selector(r"metadata.name=a\,b\=c\\d")
    assert sel.terms[0].value == "a,b=c\\d"


@pytest.mark.parametrize(("text", "message"), [
    ("foo", "invalid selector: 'foo'; can't understand 'foo'"),
    ("a=b,foo", "invalid selector: 'a=b,foo'; can't understand 'foo'"),
    ("a=b=c", "invalid field selector: unescaped character in value: 61"),
    ("a=b,c", "invalid selector: 'a=b,c'; can't understand 'c'"),
    (r"a=b\x", r"invalid field selector: invalid escape sequence: \x"),
    ("a=b\\", "invalid field selector: invalid escape sequence: \\"),
])
def test_field_selector_parse_errors(text: str, message: str) -> None:
    with pytest.raises(errors.StatusError) as caught:
        selectors.parse_field_selector(text)
    assert (caught.value.code, caught.value.message) == (400, message)


@pytest.mark.parametrize(("group", "kind", "text", "message"), [
    ("", "Pod", "spec.bogus=x", "field label not supported: spec.bogus"),
    ("", "Node", "metadata.namespace=x", "field label not supported: metadata.namespace"),
    ("", "ConfigMap", "data.x=y",
     '"data.x" is not a known field selector: only "metadata.name", "metadata.namespace"'),
    ("apps", "ReplicaSet", "status.replicas=1",
     '"status.replicas" is not a known field selector: only "metadata.name", "metadata.namespace"'),
    ("batch", "Job", "status.active=1", 'field label "status.active" not supported for batchv1.Job'),
    # Terms are checked in sorted order, so the first refusal is the alphabetically first bad one.
    ("", "Pod", "z.bad=1,a.bad=1", "field label not supported: a.bad"),
])
def test_unsupported_fields_are_refused(group: str, kind: str, text: str, message: str) -> None:
    with pytest.raises(errors.StatusError) as caught:
        selectors.parse_field_selector(text).validate(group, kind)
    assert (caught.value.code, caught.value.reason, caught.value.message) == (400, "BadRequest", message)


@pytest.mark.parametrize(("group", "kind", "text"), [
    ("", "Pod", "spec.nodeName=n,spec.restartPolicy=Always,spec.schedulerName=s,spec.serviceAccountName=a,"
                "spec.hostNetwork=false,status.phase=Running,status.podIP=1.2.3.4,status.podIPs=x,"
                "status.nominatedNodeName=n,spec.host=n,metadata.name=p,metadata.namespace=d"),
    ("", "Event", "involvedObject.kind=Pod,involvedObject.namespace=d,involvedObject.name=p,"
                  "involvedObject.uid=u,involvedObject.apiVersion=v1,involvedObject.resourceVersion=1,"
                  "involvedObject.fieldPath=f,reason=r,reportingComponent=c,source=s,type=Normal"),
    ("events.k8s.io", "Event", "regarding.kind=Pod,regarding.name=p,reportingController=c,source=s,type=t,"
                               "reason=r"),
    ("", "Secret", "type=Opaque"),
    ("", "Namespace", "status.phase=Active,metadata.name=x"),
    ("", "Node", "spec.unschedulable=true"),
    ("", "ReplicationController", "status.replicas=1"),
    ("", "Service", "spec.clusterIP=None,spec.type=ClusterIP"),
    ("batch", "Job", "status.successful=1"),
    ("certificates.k8s.io", "CertificateSigningRequest", "spec.signerName=x"),
    ("rbac.authorization.k8s.io", "Role", "metadata.name=x,metadata.namespace=y"),
])
def test_supported_fields_are_accepted(group: str, kind: str, text: str) -> None:
    selectors.parse_field_selector(text).validate(group, kind)


POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "web", "namespace": "default"},
    "spec": {"nodeName": "n1", "restartPolicy": "Always", "serviceAccountName": "default"},
    "status": {"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}]},
}


@pytest.mark.parametrize(("text", "expected"), [
    ("metadata.name=web", True),
    ("metadata.name!=web", False),
    ("metadata.namespace=default,status.phase=Running", True),
    ("status.phase=Pending", False),
    ("status.phase!=Succeeded,status.phase!=Failed", True),
    ("spec.nodeName=n1", True),
    ("spec.host=n1", True),
    ("spec.hostNetwork=false", True),  # a missing boolean reads as "false"
    ("spec.hostNetwork=true", False),
    ("spec.schedulerName=", True),  # a missing string reads as ""
    ("status.podIP=10.0.0.5", True),
    ("status.podIPs=10.0.0.5", False),  # accepted, but not a selectable field: always ""
    ("status.nominatedNodeName=", True),
])
def test_pod_field_matching(text: str, expected: bool) -> None:
    sel = selectors.parse_field_selector(text).validate("", "Pod")
    assert sel.matches(POD) is expected


def test_field_matching_without_validation_reads_the_kind_from_the_object() -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "spec": {"unschedulable": True}}
    assert selectors.parse_field_selector("spec.unschedulable=true").matches(node)
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "status": {"succeeded": 2}}
    assert selectors.parse_field_selector("status.successful=2").matches(job)
    assert selectors.parse_field_selector("status.successful!=0").matches(job)


def test_event_fields() -> None:
    core = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e", "namespace": "d"},
            "involvedObject": {"kind": "Pod", "name": "web"}, "reason": "Started", "type": "Normal",
            "reportingComponent": "kubelet", "source": {}}
    sel = selectors.parse_field_selector("involvedObject.kind=Pod,involvedObject.name=web,source=kubelet")
    assert sel.validate("", "Event").matches(core)
    v1 = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e", "namespace": "d"},
          "regarding": {"kind": "Pod", "name": "web"}, "reportingController": "kubelet", "type": "Warning"}
    sel = selectors.parse_field_selector("regarding.kind=Pod,reportingController=kubelet,type=Warning")
    assert sel.validate("events.k8s.io", "Event").matches(v1)


def test_custom_resource_selectable_fields() -> None:
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
              "spec": {"color": "red", "size": 3, "shiny": True}}
    sel = selectors.parse_field_selector("spec.color=red,spec.size=3,spec.shiny=true")
    assert sel.validate("example.com", "Widget", custom=True,
                        selectable_fields=[".spec.color", ".spec.size", ".spec.shiny"]).matches(widget)
    with pytest.raises(errors.StatusError, match=r"^field label not supported: spec\.other$"):
        selectors.parse_field_selector("spec.other=x").validate(
            "example.com", "Widget", custom=True, selectable_fields=[".spec.color"])
    with pytest.raises(errors.StatusError, match='is not a known field selector'):
        selectors.parse_field_selector("spec.color=x").validate("example.com", "Widget", custom=True)


def test_requires_exact_match() -> None:
    sel = selectors.parse_field_selector("metadata.name=web,status.phase!=Failed")
    assert sel.requires_exact_match("metadata.name") == "web"
    assert sel.requires_exact_match("status.phase") is None
    assert selectors.parse_label_selector("app=web").requires_exact_match("app") == "web"
    assert selectors.parse_label_selector("app in (web)").requires_exact_match("app") == "web"
