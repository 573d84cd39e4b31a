"""`agent pr`: propose the registry's new kernels to a team repository as a branch and a pull request."""

from __future__ import annotations

import argparse

from kernelloop.agent.commands.common_args import add_history_argument, add_registry_argument
from kernelloop.agent.pr_github import DEFAULT_GITHUB_API
from kernelloop.agent.render import print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pr", help="push registry kernels not yet proposed as a branch and open a pull request",
                       description="Export the registry under kernelloop/registry/ of a git working tree on a new "
                                   "branch, commit, push it, and open a GitHub pull request when a token and "
                                   "repository are known (else print the branch and the PR body).")
    p.add_argument("--repo", default=".", metavar="PATH", help="git working tree to propose to (default: here)")
    p.add_argument("--remote", default="origin", metavar="NAME", help="remote to push to (default: origin)")
    p.add_argument("--base", default=None, metavar="BRANCH", help="branch to start from and merge into "
                   "(default: the repository's current branch)")
    add_registry_argument(p, "registry repository")
    add_history_argument(p)
    p.add_argument("--token", default=None, help="GitHub token (default: $GITHUB_TOKEN)")
    p.add_argument("--github-repo", default=None, metavar="OWNER/NAME",
                   help="GitHub repository (default: parsed from the remote's URL when it is on github.com)")
    p.add_argument("--github-api", default=None, metavar="URL",
                   help=f"GitHub API base URL (default: $KERNELLOOP_GITHUB_API or {DEFAULT_GITHUB_API})")
    p.add_argument("--dry-run", action="store_true", help="print the branch name and the body; write nothing")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kernelloop.agent import pr  # git and the history: loaded when the command runs

    opts = pr.Options(repo=args.repo, remote=args.remote, base=args.base, registry=args.registry,
                      history=args.history, dry_run=args.dry_run, token=args.token,
                      github_repo=args.github_repo, github_api=args.github_api)
    result = pr.propose(opts)
    if args.json:
        print_json(result.to_json())
        return 0
    if not result.new:
        print(pr.NOTHING_NEW)
        return 0
    if result.dry_run:
        print(f"branch: {result.branch} (dry run: nothing exported, committed or pushed)")
        print(f"base: {result.base}")
    else:
        print(f"branch: {result.branch} pushed to {result.remote} (commit {result.commit[:10]}), base {result.base}")
    if result.url:
        print(f"pull request: {result.url}")
        return 0
    if result.github and not result.dry_run:
        print(f"no pull request opened ({result.github}); open it by hand with this title and body")
    print(f"title: {result.title}")
    print()
    print(result.body, end="")
    return 0
