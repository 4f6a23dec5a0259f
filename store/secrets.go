package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
)

// A tenant's secrets are the values its pipelines' ${NAME} references
// resolve to. Each is sealed with the ring's first key; the additional
// data binds the tenant and the name, so a row copied or moved to another
// tenant or name (by anyone with write access to the table) does not open.

// SecretInfo describes a stored secret; it never holds the value.
type SecretInfo struct {
	Tenant string `json:"tenant"`
	Name   string `json:"name"`
	// Version counts the value's changes, from 1.
	Version int64 `json:"version"`
	// KeyID names the key that sealed the value (see ReencryptSecrets).
	KeyID     string    `json:"key_id"`
	UpdatedBy string    `json:"updated_by"`
	UpdatedAt time.Time `json:"updated_at"`
}

// MaxSecretSize is the largest secret value, in bytes.
const MaxSecretSize = 64 << 10

var secretName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

const secretNameRule = "a secret name is letters, digits and _, not starting with a digit, at most 128 long"

func secretAAD(tenant, name string) []byte {
	return []byte("ferry-secret\x00" + tenant + "\x00" + name)
}

// checkSecretKey reports a bad tenant or name by field; neither is secret.
func checkSecretKey(tenant, name string) []FieldProblem {
	var probs []FieldProblem
	if !tenantName.MatchString(tenant) {
		probs = append(probs, FieldProblem{Path: "tenant", Message: tenantNameRule})
	}
	if !secretName.MatchString(name) {
		probs = append(probs, FieldProblem{Path: "name", Message: secretNameRule})
	}
	return probs
}

const secretInfoColumns = `tenant, name, version, key_id, updated_by, updated_at`

func scanSecretInfo(row pgx.Row) (SecretInfo, error) {
	var i SecretInfo
	err := row.Scan(&i.Tenant, &i.Name, &i.Version, &i.KeyID, &i.UpdatedBy, &i.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return i, ErrNotFound
	}
	return i, err
}

// PutSecret sets a tenant's secret, sealed with the store's key ring
// (ErrNoKey without one). The actor's scope must write the tenant
// (ErrForbidden). Setting the value a secret already has, under the
// current key, writes nothing. The audit entry names the tenant and the
// secret, never the value.
func (s *Store) PutSecret(ctx context.Context, actor Actor, tenant, name string, value []byte) (SecretInfo, error) {
	probs := checkSecretKey(tenant, name)
	if len(value) > MaxSecretSize {
		probs = append(probs, FieldProblem{Path: "value", Message: fmt.Sprintf("is %d bytes; a secret is at most %d", len(value), MaxSecretSize)})
	}
	if len(probs) > 0 {
		return SecretInfo{}, &ValidationError{What: "secret", Problems: probs}
	}
	if !actor.Scope.CanWriteTenant(tenant) {
		return SecretInfo{}, fmt.Errorf("%w: scope %s may not set secrets of tenant %q", ErrForbidden, actor.Scope, tenant)
	}
	if s.keyring == nil {
		return SecretInfo{}, ErrNoKey
	}
	var info SecretInfo
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		put, err := s.putSecretTx(ctx, tx, tenant, name, value, actor.String(), true)
		info = put.info
		if err != nil || !put.changed {
			return err
		}
		return audit(ctx, tx, actor, ActionSecretPut, "", tenant, put.oldVersion, &info.Version,
			fmt.Sprintf("secret %s/%s version %d (key %s)", tenant, name, info.Version, info.KeyID))
	})
	return info, err
}

// secretPut is what putSecretTx did.
type secretPut struct {
	info SecretInfo
	// oldVersion is the version replaced; nil for a new secret.
	oldVersion *int64
	// changed is false when the secret already held the value under the
	// current key: nothing was written.
	changed bool
}

// errSecretHeld refuses to overwrite a secret that holds another value.
var errSecretHeld = errors.New("already holds another value")

// putSecretTx seals value and writes it as tenant's secret name in tx,
// recording updatedBy; the caller checked the name, the size, the scope
// and that the store has a key ring, and audits. Without overwrite, a
// secret of that name that holds another value (or does not open) is
// left as it is and the put fails with errSecretHeld.
func (s *Store) putSecretTx(ctx context.Context, tx pgx.Tx, tenant, name string, value []byte, updatedBy string, overwrite bool) (secretPut, error) {
	aad := secretAAD(tenant, name)
	keyID, sealed, err := s.keyring.Seal(value, aad)
	if err != nil {
		return secretPut{}, err
	}
	var cur []byte
	var curKey string
	var curVersion int64
	err = tx.QueryRow(ctx, `SELECT ciphertext, key_id, version FROM ferry_secrets WHERE tenant = $1 AND name = $2 FOR UPDATE`,
		tenant, name).Scan(&cur, &curKey, &curVersion)
	exists := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return secretPut{}, err
	}
	if exists && (curKey == keyID || !overwrite) {
		old, openErr := s.keyring.Open(curKey, cur, aad)
		same := openErr == nil && bytes.Equal(old, value)
		switch {
		case same && curKey == keyID:
			info, err := scanSecretInfo(tx.QueryRow(ctx, `SELECT `+secretInfoColumns+` FROM ferry_secrets WHERE tenant = $1 AND name = $2`, tenant, name))
			return secretPut{info: info}, err
		case !same && !overwrite:
			return secretPut{}, fmt.Errorf("secret %s/%s %w", tenant, name, errSecretHeld)
		}
	}
	// The row lock (or, for a new secret, the primary key) serialises
	// writers of one secret: versions never repeat.
	info, err := scanSecretInfo(tx.QueryRow(ctx, `INSERT INTO ferry_secrets (tenant, name, ciphertext, key_id, updated_by)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (tenant, name) DO UPDATE SET ciphertext = EXCLUDED.ciphertext, key_id = EXCLUDED.key_id,
		  version = ferry_secrets.version + 1, updated_by = EXCLUDED.updated_by, updated_at = now()
		RETURNING `+secretInfoColumns, tenant, name, sealed, keyID, updatedBy))
	if err != nil {
		return secretPut{}, err
	}
	put := secretPut{info: info, changed: true}
	if exists {
		put.oldVersion = &curVersion
	}
	return put, nil
}

// DeleteSecret forgets a tenant's secret (ErrNotFound when it has none of
// that name). Pipelines that use it fail to resolve at the next
// convergence.
func (s *Store) DeleteSecret(ctx context.Context, actor Actor, tenant, name string) error {
	if probs := checkSecretKey(tenant, name); len(probs) > 0 {
		return &ValidationError{What: "secret", Problems: probs}
	}
	if !actor.Scope.CanWriteTenant(tenant) {
		return fmt.Errorf("%w: scope %s may not delete secrets of tenant %q", ErrForbidden, actor.Scope, tenant)
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		info, err := scanSecretInfo(tx.QueryRow(ctx, `DELETE FROM ferry_secrets WHERE tenant = $1 AND name = $2 RETURNING `+secretInfoColumns, tenant, name))
		if err != nil {
			return err
		}
		return audit(ctx, tx, actor, ActionSecretDelete, "", tenant, &info.Version, nil,
			fmt.Sprintf("secret %s/%s version %d", tenant, name, info.Version))
	})
}

// Secrets lists a tenant's secrets by name, or every tenant's (by tenant,
// then name) when tenant is empty. It needs no key and returns no value.
func (s *Store) Secrets(ctx context.Context, tenant string) ([]SecretInfo, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+secretInfoColumns+` FROM ferry_secrets WHERE $1 = '' OR tenant = $1 ORDER BY tenant, name`, tenant)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (SecretInfo, error) { return scanSecretInfo(r) })
}

// TenantSecrets opens every secret of tenant, by name: what the loader
// resolves the tenant's pipelines with. It is for resolution only; no
// value it returns may reach a response, a log or an error. A secret that
// does not open fails the call with an error naming it (ErrNoKey when the
// store has no key ring and the tenant has secrets).
func (s *Store) TenantSecrets(ctx context.Context, tenant string) (map[string]string, error) {
	all, problems, err := s.openSecrets(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	return all[tenant], nil
}

// AllSecrets opens every tenant's secrets, by tenant and name: what the
// converger resolves tenant pipelines with. A secret that does not open is
// left out and reported in problems, so one bad row does not stop the
// others from resolving. No value it returns may reach a response, a log
// or an error.
func (s *Store) AllSecrets(ctx context.Context) (secrets map[string]map[string]string, problems []error, err error) {
	return s.openSecrets(ctx, "")
}

// HasKeyring reports whether this instance can seal and open tenants'
// secrets (Options.Keyring was set).
func (s *Store) HasKeyring() bool { return s.keyring != nil }

// openSecrets opens the secrets of tenant, or of every tenant when it is
// empty, by tenant and name. A secret that does not open is left out and
// reported: one bad row (its key rotated out too early, say) must not stop
// the others from resolving.
func (s *Store) openSecrets(ctx context.Context, tenant string) (map[string]map[string]string, []error, error) {
	rows, err := s.pool.Query(ctx, `SELECT tenant, name, key_id, ciphertext FROM ferry_secrets WHERE $1 = '' OR tenant = $1 ORDER BY tenant, name`, tenant)
	if err != nil {
		return nil, nil, err
	}
	type sealedRow struct {
		tenant, name, keyID string
		sealed              []byte
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sealedRow, error) {
		var x sealedRow
		return x, r.Scan(&x.tenant, &x.name, &x.keyID, &x.sealed)
	})
	if err != nil {
		return nil, nil, err
	}
	out := map[string]map[string]string{}
	if tenant != "" {
		out[tenant] = map[string]string{}
	}
	if len(list) > 0 && s.keyring == nil {
		return out, []error{fmt.Errorf("the store holds %d tenant secrets, and this instance cannot open them: %w", len(list), ErrNoKey)}, nil
	}
	var problems []error
	for _, x := range list {
		plain, err := s.keyring.Open(x.keyID, x.sealed, secretAAD(x.tenant, x.name))
		if err != nil {
			problems = append(problems, fmt.Errorf("secret %s/%s: %w", x.tenant, x.name, err))
			continue
		}
		if out[x.tenant] == nil {
			out[x.tenant] = map[string]string{}
		}
		out[x.tenant][x.name] = string(plain)
	}
	return out, problems, nil
}

// ReencryptSecrets seals again, with the ring's first key, every secret
// sealed with another one, and returns how many it did. Run after putting
// a new key first; once it returns, the old key can leave the ring. It is
// all or nothing: a secret that does not open fails the call, naming the
// secret, and nothing changes. Only an admin may (ErrForbidden).
func (s *Store) ReencryptSecrets(ctx context.Context, actor Actor) (int, error) {
	if actor.Scope != ScopeAdmin {
		return 0, fmt.Errorf("%w: only an admin re-encrypts secrets", ErrForbidden)
	}
	if s.keyring == nil {
		return 0, ErrNoKey
	}
	current := s.keyring.SealingKeyID()
	n := 0
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		n = 0
		rows, err := tx.Query(ctx, `SELECT tenant, name, key_id, ciphertext FROM ferry_secrets WHERE key_id <> $1 ORDER BY tenant, name FOR UPDATE`, current)
		if err != nil {
			return err
		}
		type sealedRow struct {
			tenant, name, keyID string
			sealed              []byte
		}
		list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sealedRow, error) {
			var x sealedRow
			return x, r.Scan(&x.tenant, &x.name, &x.keyID, &x.sealed)
		})
		if err != nil {
			return err
		}
		for _, x := range list {
			aad := secretAAD(x.tenant, x.name)
			plain, err := s.keyring.Open(x.keyID, x.sealed, aad)
			if err != nil {
				return fmt.Errorf("secret %s/%s: %w", x.tenant, x.name, err)
			}
			keyID, sealed, err := s.keyring.Seal(plain, aad)
			if err != nil {
				return err
			}
			// The value is the same: its version stays.
			if _, err := tx.Exec(ctx, `UPDATE ferry_secrets SET ciphertext = $3, key_id = $4, updated_by = $5, updated_at = now()
				WHERE tenant = $1 AND name = $2`, x.tenant, x.name, sealed, keyID, actor.String()); err != nil {
				return err
			}
			if err := audit(ctx, tx, actor, ActionSecretReencrypt, "", x.tenant, nil, nil,
				fmt.Sprintf("secret %s/%s key %s -> %s", x.tenant, x.name, x.keyID, keyID)); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}
