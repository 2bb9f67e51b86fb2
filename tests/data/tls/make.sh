#!/usr/bin/env bash
# Makes the TLS test fixtures in this folder (run once; the outputs are committed):
#   ca.pem / ca.key           a test certificate authority
#   server.pem / server.key   a server certificate for localhost, 127.0.0.1 and ::1, by ca
#   client.pem / client.key   a client certificate (for mutual TLS), by ca
#   other-ca.pem              an authority that signed nothing here (a client trusting only
#                             it must refuse the server)
# Valid for 100 years; keys are ECDSA P-256. For tests only: the private keys are public.
set -euo pipefail
cd "$(dirname "$0")"
days=36500
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }

key ca.key
openssl req -x509 -new -key ca.key -sha256 -days $days -subj "/CN=Reverb test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out ca.pem

leaf() {  # name, subject, extensions
  key "$1.key"
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -sha256 \
    -days $days -extfile <(printf '%s\n' "$3") -out "$1.pem"
  rm "$1.csr"
}
leaf server "/CN=localhost" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1"
leaf client "/CN=reverb-test-client" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"

key other-ca.key
openssl req -x509 -new -key other-ca.key -sha256 -days $days -subj "/CN=Another CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out other-ca.pem
rm -f other-ca.key ca.srl
