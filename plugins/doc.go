// Package plugins is Ferry's extension API: the component interfaces a source,
// transform or sink implements, the registry that maps the `type:` names written
// in pipeline YAML to factories, the optional capabilities a component may
// offer, and the metadata keys every component agrees on.
//
// It owns contracts only. It must not import any Ferry package — neither the
// components (sources/, transforms/, sinks/), nor pipelines/ or internal/ —
// so that a plugin author depends on this package and Watermill alone, and
// Ferry's own components use the same API as custom ones.
//
// # Writing a component
//
// A component is a package with a typed Config (yaml tags, defaults,
// Validate), a constructor that does no I/O, and a Register function that
// adds its factory to a Registry with RegisterSource, RegisterTransform or
// RegisterSink. The loader decodes the user's YAML over the defaults, calls
// Validate, and builds the component through the factory's typed
// BuildSource, BuildTransform or BuildSink.
//
// # Capabilities
//
// Beyond Source, Transform and Sink, a component may implement optional
// capabilities (HealthReporter, HASource, Reader, …). capabilities.go lists
// every one, who calls it and what happens without it.
//
// # Source contract
//
// Every message a source emits carries metadata later stages read. A source
// MUST set, on every message:
//
//   - a non-empty message UUID: the event id consumers deduplicate on;
//   - MetaReadAt (read_at), FormatTime of the relay clock when the row was
//     read: the read_to_ack lag and the per-stage latencies start there;
//   - MetaCreatedAt (created_at), FormatTime of when the row was written on
//     the database clock: commit_to_read lag (when MetaCommitAt is not
//     set), the formats' event time, and resets and backfills by time;
//   - MetaPosition (position), the row's place in the source, in the
//     source's own words: `ferry offsets`, undecodable-row reports and the
//     formats name the row by it;
//   - MetaOutboxID (outbox_id), the row's primary key: dead letters parked
//     on the source and the formats identify the row by it;
//   - MetaAggregateID (aggregate_id), the aggregate the event belongs to —
//     or MetaKey (ferry_key) when the source knows the ordering key by
//     another name: ordering (the partitioning key, plugins.Key) and the
//     dead-letter topic's key;
//   - MetaAggregateType (aggregate_type) and MetaEventType (event_type):
//     routing (the router transform's by-type routes and topic templates)
//     and the formats. A source that publishes another system's own
//     metadata instead (watermillsql reads Watermill's forwarder table)
//     leaves these three out; its events are routed by the sink's default
//     destination or a MetaTopic the source sets.
//
// A source MAY set MetaDBReadAt (ferry_db_read_at) and MetaCommitAt
// (ferry_commit_at), Unix nanoseconds on the database clock; without
// MetaDBReadAt the commit_to_read and commit_to_ack segments are not
// measured. A row the source cannot decode is emitted with MetaUndecodable
// instead: then only the UUID, MetaPosition and the reason are required.
//
// CheckSourceMetadata checks a message against this contract and names
// every missing or malformed key; the public source conformance suite
// calls it on every message a source under test emits.
package plugins
