package plugins

import "strings"

// Headers an outbox row must not set. A row's headers column is written by
// whoever writes outbox rows — not the platform team — and travels as
// broker headers; some names steer the broker or stand for Ferry:
//
//   - Nats-… (any case): JetStream acts on Nats-Msg-Id (deduplication:
//     a row naming another event's id makes the stream drop that event),
//     Nats-Expected-…, Nats-Rollup, Nats-TTL and more to come;
//   - _watermill_… : Watermill's message uuid header, which consumers (and
//     Ferry's consumer package) deduplicate by;
//   - ferry-… : Ferry's own headers (the aggregate version the order guard
//     trusts, the headers error, the dead-letter headers), except the two
//     replay headers a backfill on the poll source writes into the row
//     itself (ReplayHeader, ReplayRequestHeader).
//
// Sources drop such a header from the event, and the pipeline counts and
// logs it (MetaReservedHeaders); sinks set their own id headers last
// besides.

// ReservedHeader reports whether a row's header named key is one a row
// must not set.
func ReservedHeader(key string) bool {
	if key == ReplayHeader || key == ReplayRequestHeader {
		return false
	}
	return BrokerReservedHeader(key) || hasPrefixFold(key, "ferry-")
}

// BrokerReservedHeader reports whether a header named key steers the
// broker or its consumers' deduplication (Nats-…, _watermill_…): no
// pipeline may set it, not even a transform the platform team configured.
func BrokerReservedHeader(key string) bool {
	return hasPrefixFold(key, "nats-") || hasPrefixFold(key, "_watermill_")
}

// MetaReservedHeaders, set by a source, lists (comma-separated) the
// headers of the row it dropped as ReservedHeader: internal, never sent.
const MetaReservedHeaders = InternalPrefix + "reserved_headers"

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
