package plugins

// MetaUndecodable marks a message that stands for an outbox row the source
// could not decode; its value says which row (position), which column,
// why, and what to do. The pipeline does not transform or publish such a
// message: it fails it with reason ReasonUndecodableRow, so the dead-letter
// topic takes it (and the source records progress past it like any acked
// row) or, without one, the pipeline reports it as its error.
const MetaUndecodable = InternalPrefix + "undecodable"

// ReasonUndecodableRow is the dead-letter reason of a row the source could
// not decode.
const ReasonUndecodableRow = "undecodable_row"
