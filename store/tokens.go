package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Token is an API token's record; the token itself is never stored.
type Token struct {
	ID          string    `json:"id"`
	Scope       Scope     `json:"scope"`
	Description string    `json:"description"`
	CreatedBy   string    `json:"created_by"`
	CreatedAt   time.Time `json:"created_at"`
	// ExpiresAt is when the token stops being accepted; nil never.
	ExpiresAt *time.Time `json:"expires_at"`
	// LastUsedAt is when a request last authenticated with it, to the
	// minute (TouchToken writes at most once a minute); nil never.
	LastUsedAt *time.Time `json:"last_used_at"`
	sha        []byte
}

// Expired reports whether the token is no longer accepted at now.
func (t Token) Expired(now time.Time) bool {
	return t.ExpiresAt != nil && !now.Before(*t.ExpiresAt)
}

// TokenOptions are a new token's optional properties.
type TokenOptions struct {
	Description string
	// TTL is how long the token is accepted; 0 forever.
	TTL time.Duration
}

// tokenPrefix marks Ferry tokens, so secret scanners can find a leaked one.
const tokenPrefix = "ferry_"

const tokenColumns = `id, scope, sha256, description, created_by, created_at, expires_at, last_used_at`

func scanToken(row pgx.Row) (Token, error) {
	var t Token
	var scope string
	err := row.Scan(&t.ID, &scope, &t.sha, &t.Description, &t.CreatedBy, &t.CreatedAt, &t.ExpiresAt, &t.LastUsedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, ErrNotFound
	}
	t.Scope = Scope(scope)
	return t, err
}

// CreateToken makes a random 256-bit token with scope that never expires,
// stores its SHA-256 hash and returns the token: the only time it is ever
// shown.
func (s *Store) CreateToken(ctx context.Context, actor Actor, scope Scope, description string) (Token, string, error) {
	return s.CreateTokenWith(ctx, actor, scope, TokenOptions{Description: description})
}

// CreateTokenWith is CreateToken with an expiry.
func (s *Store) CreateTokenWith(ctx context.Context, actor Actor, scope Scope, opts TokenOptions) (Token, string, error) {
	if opts.TTL < 0 {
		return Token{}, "", &ValidationError{What: "token", Problems: []FieldProblem{{Path: "ttl", Message: "must not be negative (0 is no expiry)"}}}
	}
	var t Token
	var secret string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		t, secret, err = insertToken(ctx, tx, actor, scope, opts.Description, opts.TTL)
		if err != nil {
			return err
		}
		return audit(ctx, tx, actor, ActionTokenCreate, "", scope.Tenant(), nil, nil, t.ID+" "+string(scope)+expiryNote(t))
	})
	if err != nil {
		return Token{}, "", err
	}
	return t, secret, nil
}

func expiryNote(t Token) string {
	if t.ExpiresAt == nil {
		return ""
	}
	return " expires " + t.ExpiresAt.UTC().Format(time.RFC3339)
}

// insertToken stores a new token's hash; ttl 0 never expires. The expiry
// is computed on the database clock, as created_at is.
func insertToken(ctx context.Context, tx pgx.Tx, actor Actor, scope Scope, description string, ttl time.Duration) (Token, string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return Token{}, "", err
	}
	secret := tokenPrefix + hex.EncodeToString(raw[:])
	var id [6]byte
	if _, err := rand.Read(id[:]); err != nil {
		return Token{}, "", err
	}
	sum := sha256.Sum256([]byte(secret))
	var ttlSeconds *float64
	if ttl > 0 {
		v := ttl.Seconds()
		ttlSeconds = &v
	}
	t, err := scanToken(tx.QueryRow(ctx, `INSERT INTO ferry_tokens (id, scope, sha256, description, created_by, expires_at)
		VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6)) RETURNING `+tokenColumns,
		"tok_"+hex.EncodeToString(id[:]), string(scope), sum[:], description, actor.String(), ttlSeconds))
	return t, secret, err
}

// RotateToken replaces a token: it makes a new one with the same scope and
// description (and, when the old one expires, the same lifetime), and lets
// the old one expire grace from now (0: at once). The old token's expiry
// only ever moves closer: rotating never revives or extends a token.
func (s *Store) RotateToken(ctx context.Context, actor Actor, id string, grace time.Duration) (Token, string, error) {
	if grace < 0 {
		return Token{}, "", &ValidationError{What: "token rotation", Problems: []FieldProblem{{Path: "grace", Message: "must not be negative (0 expires the old token now)"}}}
	}
	var t Token
	var secret string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The lock makes two rotations of one token queue: the second sees
		// the first's expiry.
		old, err := scanToken(tx.QueryRow(ctx, `SELECT `+tokenColumns+` FROM ferry_tokens WHERE id = $1 FOR UPDATE`, id))
		if err != nil {
			return err
		}
		var ttl time.Duration
		if old.ExpiresAt != nil {
			ttl = old.ExpiresAt.Sub(old.CreatedAt)
		}
		t, secret, err = insertToken(ctx, tx, actor, old.Scope, old.Description, ttl)
		if err != nil {
			return err
		}
		var oldExpires time.Time
		if err := tx.QueryRow(ctx, `UPDATE ferry_tokens SET expires_at = LEAST(coalesce(expires_at, 'infinity'), now() + make_interval(secs => $2))
			WHERE id = $1 RETURNING expires_at`, id, grace.Seconds()).Scan(&oldExpires); err != nil {
			return err
		}
		return audit(ctx, tx, actor, ActionTokenRotate, "", old.Scope.Tenant(), nil, nil,
			fmt.Sprintf("%s -> %s %s; %s expires %s", old.ID, t.ID, old.Scope, old.ID, oldExpires.UTC().Format(time.RFC3339)))
	})
	if err != nil {
		return Token{}, "", err
	}
	return t, secret, nil
}

// TouchToken records that the token was just used. It writes at most once
// a minute per token, so a busy client does not turn every request into a
// write; the guard is in the statement, so instances need not agree. It
// announces nothing: a last use is not a change to converge on.
func (s *Store) TouchToken(ctx context.Context, id string) error {
	_, err := s.pool.Exec(ctx, `UPDATE ferry_tokens SET last_used_at = now()
		WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')`, id)
	return err
}

// DeleteToken revokes a token.
func (s *Store) DeleteToken(ctx context.Context, actor Actor, id string) (Token, error) {
	var t Token
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		t, err = scanToken(tx.QueryRow(ctx, `DELETE FROM ferry_tokens WHERE id = $1 RETURNING `+tokenColumns, id))
		if err != nil {
			return err
		}
		return audit(ctx, tx, actor, ActionTokenDelete, "", t.Scope.Tenant(), nil, nil, t.ID+" "+string(t.Scope))
	})
	return t, err
}

// Tokens returns every token's record (never the token), expired ones
// included.
func (s *Store) Tokens(ctx context.Context) ([]Token, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+tokenColumns+` FROM ferry_tokens ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Token, error) { return scanToken(r) })
}

// TokenMatch is what MatchTokenAt found for a presented secret.
type TokenMatch int

// What a presented secret is.
const (
	// TokenUnknown: no token has this secret.
	TokenUnknown TokenMatch = iota
	// TokenValid: a token that has not expired.
	TokenValid
	// TokenExpired: a token past its expiry; it authenticates nothing, but
	// the caller can say "token expired" and record whose it was.
	TokenExpired
)

// String is "valid", "expired" or "unknown".
func (m TokenMatch) String() string {
	switch m {
	case TokenValid:
		return "valid"
	case TokenExpired:
		return "expired"
	}
	return "unknown"
}

// MatchToken finds the unexpired token among toks whose hash is the
// presented secret's. An expired token does not match; MatchTokenAt tells
// it apart from an unknown one.
func MatchToken(toks []Token, secret string) (Token, bool) {
	t, m := MatchTokenAt(toks, secret, time.Now())
	if m != TokenValid {
		return Token{}, false
	}
	return t, true
}

// MatchTokenAt finds the token among toks whose hash is the presented
// secret's and says whether it is valid at now or expired. Every candidate
// is compared, in constant time, so the answer takes as long whichever
// token (if any) matches; the expiry is looked at only after.
func MatchTokenAt(toks []Token, secret string, now time.Time) (Token, TokenMatch) {
	sum := sha256.Sum256([]byte(secret))
	var found Token
	ok := false
	for _, t := range toks {
		if subtle.ConstantTimeCompare(sum[:], t.sha) == 1 {
			found, ok = t, true
		}
	}
	switch {
	case !ok:
		return Token{}, TokenUnknown
	case found.Expired(now):
		return found, TokenExpired
	}
	return found, TokenValid
}
