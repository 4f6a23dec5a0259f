package secretbox_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/secretbox"
)

func key(b byte) []byte { return bytes.Repeat([]byte{b}, secretbox.KeySize) }

func TestParseKeyring(t *testing.T) {
	k1, k2 := key(1), key(2)
	id1, id2 := secretbox.KeyID(k1), secretbox.KeyID(k2)
	for _, tc := range []struct {
		name, text string
		ids        []string
		err        string // substring of the error; "" is success
	}{
		{"hex", hex.EncodeToString(k1), []string{id1}, ""},
		{"upper hex", strings.ToUpper(hex.EncodeToString(k1)), []string{id1}, ""},
		{"base64 std", base64.StdEncoding.EncodeToString(k1), []string{id1}, ""},
		{"base64 raw std", base64.RawStdEncoding.EncodeToString(k1), []string{id1}, ""},
		{"base64 url", base64.URLEncoding.EncodeToString(bytes.Repeat([]byte{0xfb}, 32)), []string{secretbox.KeyID(bytes.Repeat([]byte{0xfb}, 32))}, ""},
		{"base64 raw url", base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{0xff}, 32)), []string{secretbox.KeyID(bytes.Repeat([]byte{0xff}, 32))}, ""},
		{"comments, blanks and order", "# new key first\n\n  " + hex.EncodeToString(k2) + "  # added 2024-05\n" + base64.StdEncoding.EncodeToString(k1) + "\n\n", []string{id2, id1}, ""},
		{"CRLF", hex.EncodeToString(k1) + "\r\n" + hex.EncodeToString(k2) + "\r\n", []string{id1, id2}, ""},
		{"empty", "", nil, "no key"},
		{"only comments", "# nothing\n   \n", nil, "no key"},
		{"short hex", "\n" + hex.EncodeToString(k1[:31]), nil, "line 2: "},
		{"16-byte key", hex.EncodeToString(k1) + "\n" + base64.StdEncoding.EncodeToString(k1[:16]), nil, "line 2: a key is 32 bytes, this one decodes to 16"},
		{"garbage", hex.EncodeToString(k1) + "\n\nnot-a-key!!", nil, "line 3: not a key"},
		{"duplicate", hex.EncodeToString(k1) + "\n" + base64.StdEncoding.EncodeToString(k1), nil, "line 2: the same key appears twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kr, err := secretbox.ParseKeyring(tc.text)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := kr.KeyIDs(); fmt.Sprint(got) != fmt.Sprint(tc.ids) {
				t.Fatalf("ids %v, want %v", got, tc.ids)
			}
			if kr.SealingKeyID() != tc.ids[0] {
				t.Fatalf("sealing key %s, want %s", kr.SealingKeyID(), tc.ids[0])
			}
		})
	}
}

// A bad key line is reported by number, and nothing of its text reaches
// the error: a key one character short is still a secret.
func TestParseKeyringDoesNotEchoKeys(t *testing.T) {
	good := hex.EncodeToString(key(7))
	almost := good[:63] + "z"
	b64 := base64.StdEncoding.EncodeToString(key(9))[:40]
	_, err := secretbox.ParseKeyring(good + "\n" + almost + "\n" + b64 + "\n" + good)
	if err == nil {
		t.Fatal("bad lines accepted")
	}
	msg := err.Error()
	for _, want := range []string{"line 2", "line 3", "line 4"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not name %s", msg, want)
		}
	}
	for _, leak := range []string{good[:16], almost[:16], b64[:16]} {
		if strings.Contains(msg, leak) {
			t.Fatalf("error %q holds key material", msg)
		}
	}
}

func TestSealOpen(t *testing.T) {
	old, err := secretbox.NewKeyring(key(1))
	if err != nil {
		t.Fatal(err)
	}
	aad := []byte("ferry-secret\x00team-a\x00DB_URL")
	plain := []byte("postgres://u:hunter2@db/orders")
	id, sealed, err := old.Seal(plain, aad)
	if err != nil {
		t.Fatal(err)
	}
	if id != secretbox.KeyID(key(1)) {
		t.Fatalf("key id %s", id)
	}
	if bytes.Contains(sealed, plain) || len(sealed) != 12+len(plain)+16 {
		t.Fatalf("sealed %d bytes, want nonce+ciphertext+tag = %d, without the plaintext", len(sealed), 12+len(plain)+16)
	}
	// Two seals of one value differ: the nonce is random.
	if _, again, _ := old.Seal(plain, aad); bytes.Equal(again, sealed) {
		t.Fatal("two seals are the same bytes")
	}
	got, err := old.Open(id, sealed, aad)
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("open: %q %v", got, err)
	}

	// Rotation: a new key first seals, the old one second still opens.
	rotated, err := secretbox.NewKeyring(key(2), key(1))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rotated.Open(id, sealed, aad); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("the old key in second place does not open: %q %v", got, err)
	}
	newID, resealed, err := rotated.Seal(plain, aad)
	if err != nil || newID != secretbox.KeyID(key(2)) {
		t.Fatalf("sealed with %s (%v), want the first key", newID, err)
	}
	if _, err := old.Open(newID, resealed, aad); !errors.Is(err, secretbox.ErrUnknownKey) {
		t.Fatalf("a ring without the new key: %v", err)
	}

	for _, tc := range []struct {
		name   string
		id     string
		sealed func() []byte
		aad    []byte
	}{
		{"flipped ciphertext bit", id, func() []byte { b := bytes.Clone(sealed); b[14] ^= 1; return b }, aad},
		{"flipped nonce bit", id, func() []byte { b := bytes.Clone(sealed); b[0] ^= 1; return b }, aad},
		{"flipped tag bit", id, func() []byte { b := bytes.Clone(sealed); b[len(b)-1] ^= 1; return b }, aad},
		{"truncated", id, func() []byte { return sealed[:len(sealed)-1] }, aad},
		{"shorter than a nonce", id, func() []byte { return sealed[:5] }, aad},
		{"other tenant", id, func() []byte { return sealed }, []byte("ferry-secret\x00team-b\x00DB_URL")},
		{"other name", id, func() []byte { return sealed }, []byte("ferry-secret\x00team-a\x00DB_URL2")},
		{"no aad", id, func() []byte { return sealed }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := old.Open(tc.id, tc.sealed(), tc.aad); !errors.Is(err, secretbox.ErrOpen) || got != nil {
				t.Fatalf("opened %q, err %v; want ErrOpen", got, err)
			}
		})
	}
	if _, err := old.Open("0000000000000000", sealed, aad); !errors.Is(err, secretbox.ErrUnknownKey) {
		t.Fatalf("unknown id: %v", err)
	}
}

func TestKeyringPrintsNoKey(t *testing.T) {
	k := key(0xab)
	kr, err := secretbox.NewKeyring(k)
	if err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		out := fmt.Sprintf(verb, kr)
		if strings.Contains(out, hex.EncodeToString(k)[:8]) || strings.Contains(out, string(k[:4])) || !strings.Contains(out, secretbox.KeyID(k)) {
			t.Fatalf("%s prints %q", verb, out)
		}
	}
}

func TestLoadKeyring(t *testing.T) {
	k1, k2 := hex.EncodeToString(key(1)), base64.StdEncoding.EncodeToString(key(2))
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	if err := os.WriteFile(file, []byte("# ferry\n"+k1+"\n"+k2+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(secretbox.EnvKey, k2)
	kr, err := secretbox.LoadKeyring(file)
	if err != nil || fmt.Sprint(kr.KeyIDs()) != fmt.Sprint([]string{secretbox.KeyID(key(1)), secretbox.KeyID(key(2))}) {
		t.Fatalf("the file, not the environment, is read: %v %v", kr, err)
	}
	t.Setenv(secretbox.EnvKey, k2+","+k1)
	if kr, err := secretbox.LoadKeyring(""); err != nil || kr.SealingKeyID() != secretbox.KeyID(key(2)) || len(kr.KeyIDs()) != 2 {
		t.Fatalf("environment: %v %v", kr, err)
	}
	t.Setenv(secretbox.EnvKey, "")
	if kr, err := secretbox.LoadKeyring(""); kr != nil || err != nil {
		t.Fatalf("no key configured: %v %v, want nil, nil", kr, err)
	}
	t.Setenv(secretbox.EnvKey, k1+",nope")
	if _, err := secretbox.LoadKeyring(""); err == nil || !strings.Contains(err.Error(), "FERRY_SECRETS_KEY") || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("bad environment key: %v", err)
	}
	if _, err := secretbox.LoadKeyring(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing key file is accepted")
	}
	if err := os.WriteFile(file, []byte("# rotated out\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := secretbox.LoadKeyring(file); !errors.Is(err, secretbox.ErrNoKeys) || !strings.Contains(err.Error(), file) {
		t.Fatalf("a key file with no key: %v", err)
	}
	var none *secretbox.Keyring
	if _, _, err := none.Seal([]byte("x"), nil); !errors.Is(err, secretbox.ErrNoKeys) {
		t.Fatalf("nil ring seals: %v", err)
	}
}
