"""The operator pages' own text (01, 02), for tests that run their commands as written.

`docs/01-the-kcp-server.md` is the project's version of the page the project was specified
from; tests take step 5's YAML from it rather than from a copy, so the page and what the
tests prove cannot drift apart.
"""

from __future__ import annotations

import re

from socialweb_computer.testing import server

OPERATOR_PAGE = server.REPO_ROOT / "docs" / "01-the-kcp-server.md"


def runner_rbac_yaml() -> str:
    """Step 5: the heredoc applied to the tenant cluster (Namespace, ClusterRole, ClusterRoleBinding)."""
    match = re.search(r"<<'YAML'\n(.*?)\nYAML\n", OPERATOR_PAGE.read_text(), re.S)
    if match is None:
        raise ValueError(f"{OPERATOR_PAGE} has no step-5 heredoc (<<'YAML' ... YAML)")
    return match[1] + "\n"


def mint_script(state_dir: str, admin_kubeconfig: str, out_dir: str, cluster: str = "ci") -> str:
    """Step 4's command block as the page has it, with its placeholders filled in."""
    blocks = re.findall(r"```bash\n(.*?)```", OPERATOR_PAGE.read_text(), re.S)
    step4 = next((b for b in blocks if "internal tenantcredential" in b), None)
    if step4 is None:
        raise ValueError(
            f"{OPERATOR_PAGE} has no step-4 block (socialweb-computer internal tenantcredential)"
        )
    return (
        step4.replace("/var/lib/socialweb", state_dir)
        .replace("<admin kubeconfig>", admin_kubeconfig)
        .replace("/etc/gitlab-runner/tenant-ci", out_dir)
        .replace("CLUSTER=ci", f"CLUSTER={cluster}")
        .replace("get cluster ci ", f"get cluster {cluster} ")
    )


RUNNER_PAGE = server.REPO_ROOT / "docs" / "02-gitlab-runner.md"


def runner_config_toml(host: str, credential_dir: str, image: str, helper_image: str) -> str:
    """02's config.toml section as the page has it, with its placeholders filled in."""
    match = re.search(r"```toml\n(.*?)```", RUNNER_PAGE.read_text(), re.S)
    if match is None:
        raise ValueError(f"{RUNNER_PAGE} has no ```toml block")
    return (
        match[1]
        .replace("https://127.0.0.1:<port>", host)
        .replace("/etc/gitlab-runner/tenant-ci", credential_dir)
        .replace("<registry>/<job image>", image)
        .replace("<registry>/<helper image>", helper_image)
    )


def bash_blocks(page: str) -> list[tuple[str, list[str]]]:
    """Each ```bash block of docs/<page>: (its commands, the `# ...` lines that show its output)."""
    text = (server.REPO_ROOT / "docs" / page).read_text()
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        lines = block.splitlines()
        commands = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
        shown = [line.lstrip()[1:].strip() for line in lines if line.lstrip().startswith("#")]
        blocks.append((commands, shown))
    return blocks
