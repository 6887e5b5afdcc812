"""The pages of a notification's approve/deny link (`/link/TOKEN`, docs/observability.md).

GET shows the question and one button; only the POST decides (a link previewer or a mail
scanner that fetches the link decides nothing). A link whose signature does not check out,
that has expired, or whose question was answered already (by this link, its twin, the CLI
or the view) is refused with a page that says which."""

from __future__ import annotations

from msgspec import Struct

from durable_agent.presentation import approval_subject
from durable_agent.status import RunStatus
from durable_agent.store.links import LinkClaim, read_token
from durable_agent.store.records import ApprovalRecord, Decision
from durable_agent.store.runs import Store, moved_on
from durable_agent.ui import actions
from durable_agent.ui.pages import e, frame, u

REFUSED = {
    "tampered": (403, "This link is not valid: it was changed, or it is not from this view."),
    "expired": (410, "This link has expired. Answer from the run's page or the command line."),
    "nokey": (404, "This view has no link key: it was never started with --public-url."),
}
VERB = {Decision.APPROVED.value: "Approve", Decision.DENIED.value: "Deny"}
BY = "ui:link"  # decided_by of a decision made from a link


class Page(Struct, frozen=True):
    status: int
    html: str


def _page(status: int, title: str, body: str) -> Page:
    # No CSRF token of the view: a link's pages are read without the view's token, by
    # whoever the notification reached, and its form is the link (no token to carry).
    return Page(status, frame(title, body, csrf=""))


def _refused(why: str) -> Page:
    status, text = REFUSED[why]
    return _page(status, "link refused", f'<h1>Link refused</h1><p class="refused">{e(text)}</p>')


def _used(approval: ApprovalRecord) -> Page:
    text = (
        f"This link was already used: the question was answered ({approval.decision} by "
        f"{approval.decided_by or 'someone'}). A link decides once."
    )
    return _page(409, "link used", f'<h1>Link already used</h1><p class="refused">{e(text)}</p>')


def _resolve(store: Store, key: str | None, token: str) -> tuple[LinkClaim, ApprovalRecord] | Page:
    if not key:
        return _refused("nokey")
    claim = read_token(key, token)
    if isinstance(claim, str):
        return _refused(claim)
    if claim.decision not in VERB:
        return _refused("tampered")
    found = [a for a in store.approvals(claim.run_id) if a.id == claim.approval_id]
    if not found:
        return _refused("tampered")
    if found[0].decision is not None:
        return _used(found[0])
    status = store.get_run(claim.run_id).status
    if status != RunStatus.BLOCKED:
        return _moved_on(claim.run_id, status)
    return claim, found[0]


def _moved_on(run_id: str, status: str) -> Page:
    text = f"{moved_on(run_id, status)}. Answer from the run's page or the command line."
    return _page(409, "link outdated", f'<h1>Link outdated</h1><p class="refused">{e(text)}</p>')


def show(store: Store, key: str | None, token: str) -> Page:
    got = _resolve(store, key, token)
    if isinstance(got, Page):
        return got
    claim, approval = got
    verb = VERB[claim.decision]
    body = (
        f'<h1>{verb} for run <a href="/runs/{u(claim.run_id)}">{e(claim.run_id)}</a>?</h1>'
        f'<p class="subject">{e(approval_subject(approval.tool_name, approval.command, 400))}</p>'
        f'<p class="reason">{e(approval.reason)}</p>'
        f'<form method="post"><button type="submit" id="decide" class="act">{verb}</button></form>'
    )
    return _page(200, f"{verb.lower()} {claim.run_id}", body)


def decide(store: Store, key: str | None, token: str) -> Page:
    got = _resolve(store, key, token)
    if isinstance(got, Page):
        return got
    claim, approval = got
    approved = claim.decision == Decision.APPROVED.value
    if not store.decide_once(
        claim.run_id, approval.id, approved=approved, by=BY, while_blocked=True
    ):
        again = [a for a in store.approvals(claim.run_id) if a.id == approval.id]
        if again[0].decision is None:  # the run moved on meanwhile
            return _moved_on(claim.run_id, store.get_run(claim.run_id).status)
        return _used(again[0])
    done = actions.continue_answered(store, claim.run_id, claim.decision)
    notice = actions.NOTICES[done.notice]
    body = (
        f'<h1>{e(claim.decision.capitalize())}</h1><p class="notice">{e(notice)}</p>'
        f'<p><a href="/runs/{u(claim.run_id)}">follow run {e(claim.run_id)}</a></p>'
    )
    return _page(200, claim.decision, body)
