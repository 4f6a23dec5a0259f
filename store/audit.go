package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// AuditEntry is one change, or one minute of denied requests.
type AuditEntry struct {
	ID         int64     `json:"id"`
	At         time.Time `json:"at"`
	TokenID    string    `json:"token_id"`
	Scope      string    `json:"scope"`
	Action     string    `json:"action"`
	Pipeline   string    `json:"pipeline,omitempty"`
	Tenant     string    `json:"tenant,omitempty"`
	OldVersion *int64    `json:"old_version"`
	NewVersion *int64    `json:"new_version"`
	Detail     string    `json:"detail,omitempty"`
	// Count is how many events the entry stands for: 1 for a change, the
	// number of requests for a "denied" entry.
	Count int `json:"count"`
}

// Audit actions.
const (
	ActionCreate          = "create"
	ActionUpdate          = "update"
	ActionDelete          = "delete"
	ActionPause           = "pause"
	ActionResume          = "resume"
	ActionTenantPut       = "tenant_put"
	ActionTenantDelete    = "tenant_delete"
	ActionTokenCreate     = "token_create"
	ActionTokenDelete     = "token_delete"
	ActionTokenRotate     = "token_rotate"
	ActionSecretPut       = "secret_put"
	ActionSecretDelete    = "secret_delete"
	ActionSecretReencrypt = "secret_reencrypt"
	// ActionMigrateSecret is a stored tenant pipeline whose literal
	// passwords moved into its tenant's secrets (see
	// Converger.MigrateLiteralSecrets).
	ActionMigrateSecret = "migrate_secret"
	// ActionValidate is a pipeline checked without being stored
	// (POST /api/v1/validate): who, which pipeline, and the outcome in
	// the detail. A connect check reaches the pipeline's database and
	// broker, so it is accounted for as a write is.
	ActionValidate = "validate"
	// ActionDenied is a minute of refused requests (401, 403, 429) of one
	// caller from one address on one route with one status.
	ActionDenied = "denied"
)

// audit records one change and announces it: the notification is sent
// when the transaction commits, so listeners never read a change that
// did not happen.
func audit(ctx context.Context, tx pgx.Tx, actor Actor, action, pipeline, tenant string, oldV, newV *int64, detail string) error {
	if _, err := tx.Exec(ctx, `INSERT INTO ferry_audit (token_id, scope, action, pipeline, tenant, old_version, new_version, detail)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, actor.TokenID, string(actor.Scope), action, pipeline, tenant, oldV, newV, detail); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, NotifyChannel, action+" "+pipeline)
	return err
}

// AuditValidate records a validate request's verdict on one pipeline
// (ActionValidate). It changes nothing, so it announces nothing. detail is
// clipped: it comes from a request.
func (s *Store) AuditValidate(ctx context.Context, actor Actor, pipeline, tenant, detail string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO ferry_audit (token_id, scope, action, pipeline, tenant, detail)
		VALUES ($1, $2, $3, $4, $5, $6)`, actor.TokenID, string(actor.Scope), ActionValidate,
		clip(pipeline, 200), clip(tenant, 200), clip(detail, maxDeniedReason))
	return err
}

// AuditFilter narrows Audit.
type AuditFilter struct {
	Pipeline string
	// Action, when set, keeps the entries of that action only.
	Action string
	// BeforeID pages backwards: entries with a smaller id.
	BeforeID int64
	Limit    int
}

// Audit returns audit entries, newest first.
func (s *Store) Audit(ctx context.Context, f AuditFilter) ([]AuditEntry, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 100
	}
	rows, err := s.pool.Query(ctx, `SELECT id, at, token_id, scope, action, pipeline, tenant, old_version, new_version, detail, count
		FROM ferry_audit WHERE ($1 = '' OR pipeline = $1) AND ($2 = '' OR action = $2) AND ($3 = 0 OR id < $3)
		ORDER BY id DESC LIMIT $4`, f.Pipeline, f.Action, f.BeforeID, f.Limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var a AuditEntry
		return a, r.Scan(&a.ID, &a.At, &a.TokenID, &a.Scope, &a.Action, &a.Pipeline, &a.Tenant, &a.OldVersion, &a.NewVersion, &a.Detail, &a.Count)
	})
}

// DeniedRequest is one request the API refused.
type DeniedRequest struct {
	// TokenID is the caller's token, or "" (recorded as "-") when the
	// request named no known token.
	TokenID string
	// Scope is the token's scope, "" without one.
	Scope Scope
	// Address is the client's address as the server saw it (the TCP peer).
	Address string
	// Route is the method and route pattern ("PUT /api/v1/tenants/{name}"),
	// not the path: a scan of many paths is one route.
	Route string
	// Code is the HTTP status answered: 401, 403 or 429.
	Code int
	// Reason says why, in words that hold no secret (never the presented
	// token).
	Reason string
	// Count is how many such refusals this is (a caller that gathers them
	// writes them at once); 0 means 1.
	Count int
}

// Bounds of what a denied request records: the values come from a caller
// nobody trusts.
const (
	maxDeniedAddress = 64
	maxDeniedRoute   = 200
	maxDeniedReason  = 300
)

// AuditDenied counts a refused request in the audit log: one "denied" row
// per (caller, address, route, code) and UTC minute, whose count grows, so
// a flood writes a row a minute and not a row a request. It announces
// nothing (no instance converges on it). The reason kept is the minute's
// first.
//
// The row is found and counted by an upsert on the unique partial index
// ferry_audit_denied_minute rather than by SELECT ... FOR UPDATE: a lock
// cannot be taken on a row that does not exist yet, so two first denials
// of a minute would both find nothing and insert two rows. The index makes
// PostgreSQL arbitrate: of concurrent inserters one inserts, the others
// wait for it and increment its row.
func (s *Store) AuditDenied(ctx context.Context, d DeniedRequest) error {
	token := d.TokenID
	if token == "" {
		token = "-"
	}
	addr := clip(strings.ReplaceAll(d.Address, " ", ""), maxDeniedAddress)
	route := clip(d.Route, maxDeniedRoute)
	// The code and address hold no space, so the route, last, cannot make
	// two keys collide.
	key := strconv.Itoa(d.Code) + " " + addr + " " + route
	detail := fmt.Sprintf("%d %s from %s: %s", d.Code, route, addr, clip(d.Reason, maxDeniedReason))
	n := max(d.Count, 1)
	_, err := s.pool.Exec(ctx, `INSERT INTO ferry_audit (token_id, scope, action, tenant, detail, denied_key, count)
		VALUES ($1, $2, 'denied', $3, $4, $5, $6)
		ON CONFLICT (token_id, denied_key, (date_trunc('minute', at AT TIME ZONE 'UTC'))) WHERE action = 'denied'
		DO UPDATE SET count = ferry_audit.count + EXCLUDED.count`,
		clip(token, 64), string(d.Scope), d.Scope.Tenant(), detail, key, n)
	return err
}

// clip makes an untrusted string storable (valid UTF-8, no NUL, which
// PostgreSQL's text refuses) and cuts it to at most about n bytes.
func clip(s string, n int) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
