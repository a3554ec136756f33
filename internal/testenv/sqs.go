package testenv

// SQSEndpoint is FERRY_SQS_ENDPOINT, default http://127.0.0.1:9324
// (ElasticMQ started by compose/local/services.sh).
func SQSEndpoint() string { return Env("FERRY_SQS_ENDPOINT", "http://127.0.0.1:9324") }

// AWSRegion is FERRY_AWS_REGION, default us-east-1.
func AWSRegion() string { return Env("FERRY_AWS_REGION", "us-east-1") }

// SQSMotoEndpoint is FERRY_SQS_MOTO_ENDPOINT, default http://127.0.0.1:9325
// (moto's standalone server started by compose/local/services.sh, the
// second SQS implementation the SQS adapter's FIFO tests run against).
func SQSMotoEndpoint() string { return Env("FERRY_SQS_MOTO_ENDPOINT", "http://127.0.0.1:9325") }
