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
		if err := checkSecretQuota(ctx, tx, actor, tenant, name, len(value)); err != nil {
			return err
		}
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

// sealOverhead is what secretbox.Seal adds to a value: AES-GCM's 12-byte
// nonce and 16-byte tag. A secret's size is its value's, its ciphertext
// less this (TestSecretRoundTrip checks the framing).
const sealOverhead = 12 + 16

// checkSecretQuota refuses (ErrLimit) to set tenant's secret name to a
// value of size bytes when that would take the tenant past its
// max_secrets or max_secret_bytes. It locks the tenant's record first,
// so concurrent puts take turns and none counts before another commits:
// a race cannot go past the quota. Replacing a secret counts its new size
// in place of its old one; a put that does not grow the total (the same
// value, a shorter one) is never refused, even over a lowered quota.
func checkSecretQuota(ctx context.Context, tx pgx.Tx, actor Actor, tenant, name string, size int) error {
	limits, err := lockTenantLimits(ctx, tx, tenant, actor)
	if err != nil {
		return err
	}
	maxSecrets, maxBytes := limits.SecretQuota()
	var count, exists int
	var used, old int64
	err = tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE name = $2),
		  coalesce(sum(greatest(octet_length(ciphertext) - $3, 0)), 0),
		  coalesce(sum(greatest(octet_length(ciphertext) - $3, 0)) FILTER (WHERE name = $2), 0)
		FROM ferry_secrets WHERE tenant = $1`, tenant, name, sealOverhead).Scan(&count, &exists, &used, &old)
	if err != nil {
		return err
	}
	if exists == 0 && count >= maxSecrets {
		return fmt.Errorf("%w: tenant %s has %d secrets of its max_secrets %d; delete one or ask an admin to raise the limit",
			ErrLimit, tenant, count, maxSecrets)
	}
	if total := used - old + int64(size); total > int64(maxBytes) && int64(size) > old {
		return fmt.Errorf("%w: tenant %s's secrets hold %d bytes of its max_secret_bytes %d; this value of %d bytes would make %d",
			ErrLimit, tenant, used, maxBytes, size, total)
	}
	return nil
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

// AllSecrets opens every tenant's secrets, by tenant and name. The
// converger reads with OpenSecrets instead: only what its pipelines
// reference. A secret that does not open is
// left out and reported in problems, so one bad row does not stop the
// others from resolving. No value it returns may reach a response, a log
// or an error.
func (s *Store) AllSecrets(ctx context.Context) (secrets map[string]map[string]string, problems []error, err error) {
	return s.openSecrets(ctx, "")
}

// SecretRef names a tenant's secret and, when the caller already holds
// its value opened, the version and key of that value (0 and "" when
// not).
type SecretRef struct {
	Tenant, Name string
	Version      int64
	KeyID        string
}

// OpenedSecret is one secret as OpenSecrets found it.
type OpenedSecret struct {
	// SecretRef is the secret's version and key as stored now.
	SecretRef
	// Value is the secret's value; empty when Unchanged.
	Value string
	// Unchanged is set when the row still holds the version and key the
	// caller gave: its ciphertext was neither read nor opened.
	Unchanged bool
}

// OpenSecrets opens the secrets refs name, and only those: what the
// converger resolves the pipelines it builds with, so each convergence
// reads and decrypts what the pipelines reference and what changed since
// it last read them, not every tenant's every secret. A ref the store
// holds no secret for is left out (it was deleted, or never set). A
// secret that does not open is left out and reported in problems, by
// tenant and name. No value it returns may reach a response, a log or an
// error.
func (s *Store) OpenSecrets(ctx context.Context, refs []SecretRef) (opened []OpenedSecret, problems []error, err error) {
	if len(refs) == 0 {
		return nil, nil, nil
	}
	tenants, names, versions, keys := make([]string, len(refs)), make([]string, len(refs)), make([]int64, len(refs)), make([]string, len(refs))
	for i, r := range refs {
		tenants[i], names[i], versions[i], keys[i] = r.Tenant, r.Name, r.Version, r.KeyID
	}
	// The ciphertext of a row the caller holds at its version and key is
	// not sent: an unchanged 64 KiB secret costs a few bytes per read.
	rows, err := s.pool.Query(ctx, `SELECT s.tenant, s.name, s.version, s.key_id,
		  CASE WHEN s.version = r.version AND s.key_id = r.key_id THEN NULL ELSE s.ciphertext END
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) AS r(tenant, name, version, key_id)
		JOIN ferry_secrets s ON s.tenant = r.tenant AND s.name = r.name
		ORDER BY s.tenant, s.name`, tenants, names, versions, keys)
	if err != nil {
		return nil, nil, err
	}
	type sealedRow struct {
		ref    SecretRef
		sealed []byte
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sealedRow, error) {
		var x sealedRow
		return x, r.Scan(&x.ref.Tenant, &x.ref.Name, &x.ref.Version, &x.ref.KeyID, &x.sealed)
	})
	if err != nil {
		return nil, nil, err
	}
	for _, x := range list {
		if x.sealed == nil {
			opened = append(opened, OpenedSecret{SecretRef: x.ref, Unchanged: true})
			continue
		}
		if s.keyring == nil {
			problems = append(problems, fmt.Errorf("secret %s/%s: this instance cannot open it: %w", x.ref.Tenant, x.ref.Name, ErrNoKey))
			continue
		}
		plain, err := s.keyring.Open(x.ref.KeyID, x.sealed, secretAAD(x.ref.Tenant, x.ref.Name))
		if err != nil {
			problems = append(problems, fmt.Errorf("secret %s/%s: %w", x.ref.Tenant, x.ref.Name, err))
			continue
		}
		opened = append(opened, OpenedSecret{SecretRef: x.ref, Value: string(plain)})
	}
	return opened, problems, nil
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
