// Package secretbox seals and opens small secrets with AES-256-GCM under a
// key ring: the first key seals, every key opens, so an operator rotates by
// putting a new key first, re-sealing, then dropping the old line.
//
// It is pure cryptography over the standard library: it must not import any
// Ferry package, and no error it returns holds key material or plaintext.
package secretbox

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// KeySize is the size of every key: AES-256.
const KeySize = 32

// EnvKey is the environment variable LoadKeyring reads when no key file is
// given. Its value holds keys as a key file does; commas separate keys too,
// since a multi-line environment variable is awkward to set.
const EnvKey = "FERRY_SECRETS_KEY"

// Errors callers tell apart.
var (
	// ErrUnknownKey is a sealed value whose key is not in the ring (it was
	// removed before the value was re-sealed under a newer key).
	ErrUnknownKey = errors.New("sealed with a key that is not in the key ring")
	// ErrOpen is a sealed value that does not authenticate: tampered, cut
	// short, or sealed for other additional data (another tenant or name).
	ErrOpen = errors.New("does not open: tampered, truncated or sealed for another owner")
	// ErrNoKeys is an empty key ring.
	ErrNoKeys = errors.New("the key ring holds no key")
)

// Keyring is an ordered set of AES-256 keys. It is safe for concurrent use;
// it never exposes its keys, and prints only their ids.
type Keyring struct {
	keys []ringKey
}

type ringKey struct {
	id   string
	aead cipher.AEAD
}

// KeyID names a key without revealing it: the first 8 bytes of its SHA-256,
// in hex. Sealed values carry it, so opening picks the right key and an
// operator sees which values still use an old one.
func KeyID(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

// NewKeyring builds a ring from raw keys, the first sealing. Every key must
// be KeySize bytes and appear once.
func NewKeyring(keys ...[]byte) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, ErrNoKeys
	}
	kr := &Keyring{}
	for i, k := range keys {
		if err := kr.add(k); err != nil {
			return nil, fmt.Errorf("key %d: %w", i+1, err)
		}
	}
	return kr, nil
}

func (kr *Keyring) add(key []byte) error {
	if len(key) != KeySize {
		return fmt.Errorf("want %d bytes, got %d", KeySize, len(key))
	}
	id := KeyID(key)
	for _, k := range kr.keys {
		if k.id == id {
			return errors.New("the same key appears twice")
		}
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return err
	}
	kr.keys = append(kr.keys, ringKey{id: id, aead: aead})
	return nil
}

// ParseKeyring reads one key per line, each 32 bytes written as 64 hex
// digits or as base64 (standard or URL alphabet, padded or not). Blank
// lines and everything from a '#' on are ignored. An error names the line
// and what is wrong with it, never the line's text.
func ParseKeyring(text string) (*Keyring, error) {
	kr := &Keyring{}
	var errs []error
	for i, line := range strings.Split(text, "\n") {
		if c := strings.IndexByte(line, '#'); c >= 0 {
			line = line[:c]
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		key, err := decodeKey(line)
		if err == nil {
			err = kr.add(key)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", i+1, err))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(kr.keys) == 0 {
		return nil, ErrNoKeys
	}
	return kr, nil
}

// decodeKey reads one key; its error does not quote the text.
func decodeKey(s string) ([]byte, error) {
	if len(s) == 2*KeySize {
		if k, err := hex.DecodeString(s); err == nil {
			return k, nil
		}
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		k, err := enc.DecodeString(s)
		if err != nil {
			continue
		}
		if len(k) != KeySize {
			return nil, fmt.Errorf("a key is %d bytes, this one decodes to %d (want 64 hex digits or base64 of 32 bytes)", KeySize, len(k))
		}
		return k, nil
	}
	return nil, fmt.Errorf("not a key: want 64 hex digits or base64 of %d bytes (%d characters given)", KeySize, len(s))
}

// LoadKeyring reads the key ring from file when it is not empty (the
// --secrets-key-file flag), else from $FERRY_SECRETS_KEY. With neither it
// returns nil and no error: this instance has no key, and whoever needs
// one says so.
func LoadKeyring(file string) (*Keyring, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("secrets key file: %w", err)
		}
		kr, err := ParseKeyring(string(b))
		if err != nil {
			return nil, fmt.Errorf("secrets key file %s: %w", file, err)
		}
		return kr, nil
	}
	v, ok := os.LookupEnv(EnvKey)
	if !ok || strings.TrimSpace(v) == "" {
		return nil, nil
	}
	kr, err := ParseKeyring(strings.ReplaceAll(v, ",", "\n"))
	if err != nil {
		return nil, fmt.Errorf("$%s (keys counted as lines, commas separating keys too): %w", EnvKey, err)
	}
	return kr, nil
}

// SealingKeyID is the id of the key Seal uses.
func (kr *Keyring) SealingKeyID() string {
	if kr == nil || len(kr.keys) == 0 {
		return ""
	}
	return kr.keys[0].id
}

// KeyIDs are the ids of the ring's keys, the sealing key first.
func (kr *Keyring) KeyIDs() []string {
	if kr == nil {
		return nil
	}
	ids := make([]string, len(kr.keys))
	for i, k := range kr.keys {
		ids[i] = k.id
	}
	return ids
}

// Seal encrypts plaintext with the ring's first key, binding aad (which is
// not stored: Open must be given the same). The result is the key's id and
// a random 12-byte nonce followed by the ciphertext and its tag.
func (kr *Keyring) Seal(plaintext, aad []byte) (keyID string, sealed []byte, err error) {
	if kr == nil || len(kr.keys) == 0 {
		return "", nil, ErrNoKeys
	}
	k := kr.keys[0]
	nonce := make([]byte, k.aead.NonceSize(), k.aead.NonceSize()+len(plaintext)+k.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", nil, fmt.Errorf("seal: %w", err)
	}
	return k.id, k.aead.Seal(nonce, nonce, plaintext, aad), nil
}

// Open decrypts what Seal returned, with the ring's key named keyID, and
// checks it was sealed for aad.
func (kr *Keyring) Open(keyID string, sealed, aad []byte) ([]byte, error) {
	if kr == nil {
		return nil, ErrNoKeys
	}
	for _, k := range kr.keys {
		if k.id != keyID {
			continue
		}
		n := k.aead.NonceSize()
		if len(sealed) < n+k.aead.Overhead() {
			return nil, ErrOpen
		}
		plain, err := k.aead.Open(nil, sealed[:n], sealed[n:], aad)
		if err != nil {
			return nil, ErrOpen
		}
		return plain, nil
	}
	return nil, fmt.Errorf("key %s: %w", keyID, ErrUnknownKey)
}

// String names the keys by id only.
func (kr *Keyring) String() string {
	return "secretbox.Keyring[" + strings.Join(kr.KeyIDs(), " ") + "]"
}

// GoString keeps %#v from printing anything but ids either.
func (kr *Keyring) GoString() string { return kr.String() }
