package outbox

// ClaimSQL is the relay's claim statement, for the plan tests.
var ClaimSQL = claimSQL
