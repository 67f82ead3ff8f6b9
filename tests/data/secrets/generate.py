#!/usr/bin/env python3
"""Writes positive.jsonl and negative.jsonl, the corpora that measure the secret catalog
(src/domain/memory/secrets.rs) in tests/memory_detectors.rs.

Every value is random (a fixed seed, so the files are reproducible) in the documented
shape of the credential: none is a real secret. A template marks the part that must be
gone after redaction with [[...]]; placeholders {kind:N} are N random characters of an
alphabet, {uuid} a random UUID.

    python3 tests/data/secrets/generate.py   # rewrites the two files next to it

Positive: the credential as people paste it (a config line, a shell command, a sentence).
Negative: the nearest thing that is not one (truncated, wrong alphabet, a placeholder, a
public counterpart, prose that names the format).
"""

import json
import os
import random
import re

ALPHABETS = {
    "hex": "0123456789abcdef",
    "HEX": "0123456789ABCDEF",
    "alnum": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
    "lower": "abcdefghijklmnopqrstuvwxyz0123456789",
    "upper": "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    "b32": "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567",
    "b64": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
    "b64url": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-",
    "digits": "0123456789",
    "alpha": "abcdefghijklmnopqrstuvwxyz",
    "bech32": "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L",
    "crypt": "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
}

rng = random.Random(17)


def fill(template):
    def one(m):
        kind = m.group(1)
        if kind == "uuid":
            h = "".join(rng.choice(ALPHABETS["hex"]) for _ in range(32))
            return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        n = int(m.group(2))
        alphabet = ALPHABETS[kind]
        s = "".join(rng.choice(alphabet) for _ in range(n))
        if kind in ("alnum", "lower", "upper", "b64", "b64url") and n >= 8:
            # Real tokens of these alphabets hold letters and digits; make sure.
            s = s[:-2] + rng.choice("0123456789") + rng.choice("abcdefghijklmnopqrstuvwxyz" if kind != "upper" else "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
        return s

    text = re.sub(r"\{(uuid|[A-Za-z0-9]+)(?::(\d+))?\}", one, template)
    secrets = re.findall(r"\[\[(.*?)\]\]", text, flags=re.S)
    return text.replace("[[", "").replace("]]", ""), secrets


PEM_BODY = "{b64:64}\n{b64:64}\n{b64:40}"
JSON_PEM_BODY = "{b64:64}\\n{b64:64}\\n{b64:40}"

# rule id -> (positive templates, negative templates)
CASES = {
    "private_key_rsa": (["-----BEGIN RSA PRIVATE KEY-----\n[[MIIEow" + PEM_BODY + "\n-----END RSA PRIVATE KEY-----]]"], ["-----BEGIN RSA PUBLIC KEY-----\nMIIBCgKCAQEA{b64:60}\n-----END RSA PUBLIC KEY-----"]),
    "private_key_ec": (["key.pem:\n-----BEGIN EC PRIVATE KEY-----\n[[MHcCAQEE" + PEM_BODY + "\n-----END EC PRIVATE KEY-----]]"], ["The file begins with a line that names an EC PRIVATE KEY; never paste it here."]),
    "private_key_dsa": (["-----BEGIN DSA PRIVATE KEY-----\n[[MIIBuwIBAAKBgQ" + PEM_BODY + "\n-----END DSA PRIVATE KEY-----]]"], ["DSA keys are deprecated; rotate to Ed25519 (ssh-keygen -t ed25519)."]),
    "private_key_openssh": (["cat ~/.ssh/id_ed25519\n-----BEGIN OPENSSH PRIVATE KEY-----\n[[b3BlbnNzaC1rZXktdjEAAAAA" + PEM_BODY + "\n-----END OPENSSH PRIVATE KEY-----]]"], ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{b64:43} alice@laptop"]),
    "private_key_pkcs8": (['"private_key": "-----BEGIN PRIVATE KEY-----\\n[[MIIEvQIBADANBg' + JSON_PEM_BODY + '\\n-----END PRIVATE KEY-----]]\\n"'], ["-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIE{b64:60}\n-----END CERTIFICATE-----"]),
    "private_key_encrypted": (["-----BEGIN ENCRYPTED PRIVATE KEY-----\n[[MIIFHDBOBgkqhkiG9w0BBQ0w" + PEM_BODY + "\n-----END ENCRYPTED PRIVATE KEY-----]]"], ["Store the encrypted private key in the vault, not in the repository."]),
    "private_key_pgp": (["-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n[[lQdGBF" + PEM_BODY + "\n-----END PGP PRIVATE KEY BLOCK-----]]"], ["-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBF{b64:60}\n-----END PGP PUBLIC KEY BLOCK-----"]),
    "private_key_ssh2": (["---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: \"rsa-key\"\n[[P2/56wAAA" + PEM_BODY + "\n---- END SSH2 ENCRYPTED PRIVATE KEY ----]]"], ["---- BEGIN SSH2 PUBLIC KEY ----\nAAAAB3NzaC1yc2E{b64:60}\n---- END SSH2 PUBLIC KEY ----"]),
    "putty_private_key": (["PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nPublic-Lines: 2\nAAAAC3NzaC1lZDI1NTE5\nPrivate-Lines: 1\n[[AAAAI{b64:40}\n]]Private-MAC: {hex:64}"], ["Convert the .ppk with puttygen; the private lines stay on your machine."]),
    "openvpn_static_key": (["-----BEGIN OpenVPN Static key V1-----\n[[{hex:32}\n{hex:32}\n{hex:32}\n-----END OpenVPN Static key V1-----]]"], ["OpenVPN tls-auth needs a static key generated with openvpn --genkey."]),
    "age_secret_key": (["# created: 2024-05-01\n[[AGE-SECRET-KEY-1{bech32:58}]]"], ["age1{lower:58} is the public recipient"]),
    "aws_access_key_id": (["aws_access_key_id = [[AKIA{b32:16}]]", "role creds [[ASIA{b32:16}]]"], ["the id AKIA{b32:12} was truncated in the log", "AKIAi{alpha:15} is not a key id"]),
    "aws_secret_access_key": (["export AWS_SECRET_ACCESS_KEY=[[{b64:40}]]", 'aws_secret_access_key: "[[{b64:40}]]"'], ["AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY}"]),
    "aws_session_token": (["AWS_SESSION_TOKEN=[[FwoGZXIvYXdzE{b64:180}]]"], ["aws_session_token is only needed for temporary credentials"]),
    "aws_mws_key": (["mws auth token [[amzn.mws.{uuid}]]"], ["MWS tokens look like amzn.mws.<uuid>"]),
    "aws_presigned_signature": (["https://bucket.s3.amazonaws.com/report.pdf?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA{b32:16}%2F20240501%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20240501T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Signature=[[{hex:64}]]"], ["https://bucket.s3.amazonaws.com/report.pdf?X-Amz-Expires=3600&X-Amz-SignedHeaders=host"]),
    "aws_presigned_security_token": (["https://b.s3.amazonaws.com/k?X-Amz-Security-Token=[[IQoJb3JpZ2luX2Vj{b64url:120}]]&X-Amz-Date=20240501T000000Z"], ["add X-Amz-Security-Token when signing with temporary credentials"]),
    "gcs_signed_url_signature": (["https://storage.googleapis.com/bucket/obj?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=sa%40proj.iam.gserviceaccount.com%2F20240501%2Fauto%2Fstorage%2Fgoog4_request&X-Goog-Date=20240501T000000Z&X-Goog-Expires=900&X-Goog-SignedHeaders=host&X-Goog-Signature=[[{hex:512}]]"], ["https://storage.googleapis.com/bucket/obj?X-Goog-Expires=900"]),
    "url_signature_param": (["https://d111111abcdef8.cloudfront.net/image.jpg?Expires=1714521600&Signature=[[{b64url:172}]]&Key-Pair-Id=K2JCJMDEHXQW5F", "https://s3.amazonaws.com/b/k?AWSAccessKeyId=AKIA{b32:16}&Expires=1714521600&Signature=[[{b64:27}%3D]]"], ["The Signature=HMAC step is described in the SigV2 docs."]),
    "azure_sas_signature": (["https://acct.blob.core.windows.net/c/blob.txt?sv=2022-11-02&ss=b&srt=o&sp=r&se=2024-05-01T00:00:00Z&st=2024-04-01T00:00:00Z&spr=https&sig=[[{b64:40}%2B{b64:2}%3D]]", "SharedAccessSignature=sv=2022-11-02&ss=b&sp=rl&se=2025-01-01&sig=[[{b64:43}=]]"], ["https://acct.blob.core.windows.net/c/blob.txt?sv=2022-11-02&sig=redacted"]),
    "azure_storage_account_key": (["DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=[[{b64:86}==]];EndpointSuffix=core.windows.net"], ["DefaultEndpointsProtocol=https;AccountName=acct;EndpointSuffix=core.windows.net"]),
    "azure_shared_access_key": (["Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=[[{b64:43}=]]"], ["SharedAccessKeyName=RootManageSharedAccessKey is the default policy name"]),
    "azure_ad_client_secret": (["client secret [[{alnum:3}8Q~{b64url:34}]]"], ["secrets created in the portal contain the characters Q~"]),
    "azure_client_secret_assignment": (["AZURE_CLIENT_SECRET=[[{alnum:34}]]"], ["AZURE_CLIENT_SECRET=<your-secret>"]),
    "google_api_key": (["maps key [[AIza{b64url:35}]]"], ["AIza{b64url:20} (truncated)"]),
    "google_oauth_client_secret": (['"client_secret": "[[GOCSPX-{b64url:28}]]"'], ["Client secrets now start with GOCSPX-."]),
    "google_oauth_access_token": (["Authorization: Bearer [[ya29.{b64url:140}]]"], ["tokens beginning ya29. expire after an hour"]),
    "google_oauth_refresh_token": (['"refresh_token": "[[1//0{b64url:100}]]"'], ["see https://accounts.google.com//o/oauth2 for docs"]),
    "gcp_private_key_id": (['"private_key_id": "[[{hex:40}]]",'], ['"private_key_id": "",']),
    "client_secret_assignment": (["client_secret=[[{alnum:32}]]"], ["client_secret is issued when you register the app"]),
    "digitalocean_pat": (["DIGITALOCEAN_TOKEN [[dop_v1_{hex:64}]]"], ["do tokens start with dop_v1_"]),
    "digitalocean_oauth_token": (["token [[doo_v1_{hex:64}]]"], ["doo_v1_{hex:20}"]),
    "digitalocean_refresh_token": (["refresh [[dor_v1_{hex:64}]]"], ["dor_v1_ prefix marks refresh tokens"]),
    "alibaba_access_key_id": (["AccessKeyId: [[LTAI{alnum:20}]]"], ["LTAI{alnum:10} is cut short"]),
    "tencent_secret_id": (["SecretId=[[AKID{alnum:32}]]"], ["SecretId values begin with AKID"]),
    "yandex_api_key": (["YC_API_KEY [[AQVN{b64url:37}]]"], ["AQVN keys are for service accounts"]),
    "yandex_iam_token": (["iam token [[t1.{b64url:40}.{b64url:86}]]"], ["version t1.2 of the tool"]),
    "yandex_access_key": (["aws_access_key_id = [[YC{b64url:38}]]"], ["YCombinator demo day was great"]),
    "scaleway_access_key": (["SCW_ACCESS_KEY=[[SCW{upper:17}]]"], ["SCW_DEFAULT_REGION=fr-par"]),
    "heroku_api_key": (["HEROKU_API_KEY=[[{uuid}]]"], ["heroku apps:info --app demo"]),
    "heroku_api_key_v2": (["heroku token [[HRKU-{b64url:60}]]"], ["HRKU- tokens replaced UUID keys"]),
    "cloudflare_origin_ca_key": (["origin ca [[v1.0-{hex:24}-{hex:146}]]"], ["released v1.0-beta of the site"]),
    "cloudflare_api_token": (["CLOUDFLARE_API_TOKEN=[[{b64url:40}]]"], ["cloudflare api token permissions: Zone.DNS edit"]),
    "databricks_token": (["DATABRICKS_TOKEN [[dapi{hex:32}]]"], ["dapi tokens expire after 90 days"]),
    "github_pat": (["git remote set-url origin https://x:[[ghp_{alnum:36}]]@github.com/acme/app", "token [[ghp_{alnum:36}]]"], ["classic tokens look like ghp_{alnum:10}"]),
    "github_oauth_token": (["gh auth token -> [[gho_{alnum:36}]]"], ["gho_ is the OAuth prefix"]),
    "github_user_to_server_token": (["[[ghu_{alnum:36}]]"], ["ghu_{alnum:12}"]),
    "github_server_to_server_token": (["GITHUB_TOKEN=[[ghs_{alnum:36}]]"], ["GITHUB_TOKEN is provided by Actions"]),
    "github_refresh_token": (["refresh_token=[[ghr_{alnum:76}]]"], ["ghr_ tokens refresh user tokens"]),
    "github_fine_grained_pat": (["[[github_pat_{alnum:22}_{alnum:59}]]"], ["github_pat_{alnum:22} was truncated"]),
    "gitlab_pat": (["PRIVATE-TOKEN: [[glpat-{b64url:20}]]"], ["glpat-{alnum:8}"]),
    "gitlab_pipeline_trigger_token": (["curl -X POST -F token=[[glptt-{hex:40}]] https://gitlab.example.com/api/v4/projects/1/trigger/pipeline"], ["glptt-{hex:20}"]),
    "gitlab_runner_registration_token": (["--registration-token [[GR1348941{b64url:20}]]"], ["GR1348941 is the prefix"]),
    "gitlab_runner_auth_token": (["token = \"[[glrt-{b64url:20}]]\""], ["glrt- tokens replace registration tokens"]),
    "gitlab_deploy_token": (["[[gldt-{b64url:20}]]"], ["gldt-{alnum:6}"]),
    "gitlab_feed_token": (["feed_token=[[glft-{b64url:20}]]"], ["glft-{alnum:10}"]),
    "gitlab_scim_token": (["[[glsoat-{b64url:20}]]"], ["glsoat-{alnum:5}"]),
    "gitlab_oauth_app_secret": (["[[gloas-{hex:64}]]"], ["gloas-{hex:30}"]),
    "gitlab_incoming_mail_token": (["[[glimt-{lower:25}]]"], ["glimt-{lower:10}"]),
    "gitlab_ci_job_token": (["CI_JOB_TOKEN=[[glcbt-{b64url:24}]]"], ["glcbt-{alnum:8}"]),
    "bitbucket_app_password": (["app password [[ATBB{alnum:32}]]"], ["ATBB{alnum:10}"]),
    "atlassian_api_token": (["JIRA_API_TOKEN [[ATATT3xFfGF0{b64url:180}]]"], ["ATATT3{alnum:40}"]),
    "npm_token": (["[[npm_{alnum:36}]]"], ["npm_{alnum:20}"]),
    "npmrc_auth_token": (["//registry.npmjs.org/:_authToken=[[{b64url:36}]]"], ["//registry.npmjs.org/:_authToken=${NPM_TOKEN}"]),
    "pypi_token": (["password = [[pypi-AgEIcHlwaS5vcmc{b64url:120}]]"], ["pypi-AgEIcHlwaS5vcmc{b64url:20}"]),
    "rubygems_api_key": (["GEM_HOST_API_KEY: [[rubygems_{hex:48}]]"], ["rubygems_{hex:24}"]),
    "nuget_api_key": (["nuget push pkg.nupkg -k [[oy2{lower:43}]]"], ["oy2{lower:20}"]),
    "clojars_token": (["CLOJARS_PASSWORD=[[CLOJARS_{lower:60}]]"], ["CLOJARS_{lower:30}"]),
    "dockerhub_token": (["docker login -u acme -p [[dckr_pat_{b64url:27}]]"], ["dckr_pat_{alnum:10}"]),
    "docker_config_auth": (['{"auths": {"registry.example.com": {"auth": "[[{b64:32}]]"}}}'], ['{"auths": {"registry.example.com": {"auth": ""}}}']),
    "artifactory_api_key": (["X-JFrog-Art-Api: [[AKCp{alnum:69}]]"], ["AKCp{alnum:20}"]),
    "artifactory_reference_token": (["[[cmVmdGtuOjAxOj{alnum:50}]]"], ["cmVmdGtuOjAxOj{alnum:10}"]),
    "terraform_cloud_token": (['token = "[[{alnum:14}.atlasv1.{b64url:67}]]"'], ["{alnum:14}.atlasv1.{alnum:20}"]),
    "vault_service_token": (["VAULT_TOKEN=[[hvs.{b64url:95}]]"], ["hvs.{alnum:24} (cut short)"]),
    "vault_batch_token": (["[[hvb.{b64url:138}]]"], ["hvb.{alnum:40}"]),
    "circleci_pat": (["[[CCIPAT_{alnum:22}_{hex:40}]]"], ["CCIPAT_{alnum:22}"]),
    "pulumi_access_token": (["PULUMI_ACCESS_TOKEN [[pul-{hex:40}]]"], ["pul-{hex:20}"]),
    "doppler_token": (["DOPPLER_TOKEN=[[dp.st.{alnum:43}]]"], ["dp.st.{alnum:10}"]),
    "sourcegraph_token": (["[[sgp_{hex:16}_{hex:40}]]"], ["sgp_{hex:20}"]),
    "grafana_cloud_token": (["[[glc_{b64:64}]]"], ["glc_{alnum:12}"]),
    "grafana_service_account_token": (["[[glsa_{alnum:32}_{hex:8}]]"], ["glsa_{alnum:32}"]),
    "sentry_org_token": (["SENTRY_AUTH_TOKEN=[[sntrys_eyJ{b64url:100}]]"], ["sntrys_eyJ{alnum:10}"]),
    "sentry_user_token": (["[[sntryu_{hex:64}]]"], ["sntryu_{hex:30}"]),
    "buildkite_token": (["[[bkua_{hex:40}]]"], ["bkua_{hex:20}"]),
    "octopus_deploy_api_key": (["X-Octopus-ApiKey: [[API-{upper:26}]]"], ["API-{upper:10}"]),
    "infracost_api_key": (["INFRACOST_API_KEY [[ico-{alnum:32}]]"], ["ico-{alnum:16}"]),
    "scalingo_api_token": (["[[tk-us-{b64url:48}]]"], ["tk-us-{alnum:12}"]),
    "prefect_api_key": (["PREFECT_API_KEY [[pnu_{alnum:36}]]"], ["pnu_{alnum:12}"]),
    "planetscale_token": (["[[pscale_tkn_{b64url:43}]]", "[[pscale_pw_{b64url:43}]]"], ["pscale_tkn_{alnum:10}"]),
    "supabase_management_token": (["[[sbp_{hex:40}]]"], ["sbp_{hex:20}"]),
    "onepassword_service_account_token": (["OP_SERVICE_ACCOUNT_TOKEN [[ops_eyJ{b64url:300}]]"], ["ops_eyJ{alnum:30}"]),
    "onepassword_secret_key": (["secret key [[A3-{upper:6}-{upper:11}-{upper:5}-{upper:5}-{upper:5}]]"], ["A3-{upper:6}-{upper:5}"]),
    "kubeconfig_client_key_data": (["    client-key-data: [[LS0tLS1CRUdJTi{b64:120}=]]"], ["    client-certificate-data: LS0tLS1CRUdJTi{b64:120}="]),
    "new_relic_user_api_key": (["[[NRAK-{upper:27}]]"], ["NRAK-{upper:12}"]),
    "new_relic_insert_key": (["X-Insert-Key: [[NRII-{b64url:32}]]"], ["NRII-{alnum:10}"]),
    "new_relic_browser_key": (["[[NRJS-{hex:19}]]"], ["NRJS-{hex:8}"]),
    "dynatrace_token": (["Api-Token [[dt0c01.{upper:24}.{upper:64}]]"], ["dt0c01.{upper:24}"]),
    "datadog_api_key": (["DD_API_KEY=[[{hex:32}]]"], ["DD_API_KEY=<datadog-api-key>"]),
    "datadog_app_key": (["DD_APP_KEY=[[{hex:40}]]"], ["DD_APP_KEY is needed for the API, not the agent"]),
    "linear_api_key": (["[[lin_api_{alnum:40}]]"], ["lin_api_{alnum:16}"]),
    "postman_api_key": (["X-Api-Key: [[PMAK-{hex:24}-{hex:34}]]"], ["PMAK-{hex:24}"]),
    "readme_api_key": (["[[rdme_{lower:70}]]"], ["rdme_{lower:20}"]),
    "figma_pat": (["X-Figma-Token: [[figd_{b64url:40}]]"], ["figd_{alnum:10}"]),
    "notion_token": (["[[ntn_{alnum:46}]]"], ["ntn_{alnum:10}"]),
    "notion_integration_secret": (["NOTION_KEY=[[secret_{alnum:43}]]"], ["the secret_santa list is in the notion page"]),
    "airtable_pat": (["[[pat{alnum:14}.{hex:64}]]"], ["pattern{alnum:7}.{hex:16}"]),
    "contentful_pat": (["[[CFPAT-{b64url:43}]]"], ["CFPAT-{alnum:10}"]),
    "frameio_token": (["[[fio-u-{b64url:64}]]"], ["fio-u-{alnum:10}"]),
    "adafruit_io_key": (["ADAFRUIT_IO_KEY=[[aio_{alnum:28}]]"], ["aio_{alnum:10}"]),
    "mapbox_secret_token": (["[[sk.eyJ{b64url:60}.{b64url:22}]]"], ["pk.eyJ{b64url:60}.{b64url:22} is the public token"]),
    "firebase_fcm_server_key": (["key=[[AAAA{b64url:7}:APA91b{b64url:134}]]"], ["AAAA{b64url:7}:APA91b{b64url:20}"]),
    "okta_api_token": (["Authorization: SSWS [[00{b64url:40}]]"], ["Okta uses the SSWS scheme for API tokens"]),
    "facebook_access_token": (["access_token=[[EAAB{alnum:120}]]"], ["EAAB{alnum:20}"]),
    "slack_bot_token": (["SLACK_BOT_TOKEN=[[xoxb-{digits:12}-{digits:13}-{alnum:24}]]"], ["xoxb-{digits:5}"]),
    "slack_user_token": (["[[xoxp-{digits:12}-{digits:12}-{digits:13}-{hex:32}]]"], ["xoxp-{digits:12}-{alnum:6}"]),
    "slack_app_token": (["SLACK_APP_TOKEN=[[xapp-1-{upper:11}-{digits:13}-{hex:64}]]"], ["xapp-1-{upper:6}"]),
    "slack_legacy_token": (["[[xoxs-{digits:12}-{alnum:20}]]", "[[xoxr-{digits:10}-{alnum:40}]]"], ["xoxs-{digits:4}-{alnum:4}"]),
    "slack_config_token": (["[[xoxe.xoxp-1-{alnum:160}]]", "[[xoxe-1-{alnum:140}]]"], ["xoxe.xoxp-1-{alnum:20}"]),
    "slack_webhook_url": (["https://hooks.slack.com/services/[[T{upper:10}/B{upper:10}/{alnum:24}]]"], ["https://hooks.slack.com/services/ (set in the app settings)"]),
    "discord_bot_token": (["DISCORD_TOKEN=[[M{b64url:25}.{b64url:6}.{b64url:38}]]"], ["M{b64url:25}.{b64url:6}"]),
    "discord_webhook_url": (["https://discord.com/api/webhooks/{digits:18}/[[{b64url:68}]]"], ["https://discord.com/api/webhooks/{digits:18}/"]),
    "telegram_bot_token": (["bot [[{digits:10}:AA{b64url:33}]]"], ["meeting at 10:AAA room"]),
    "teams_webhook_url": (["https://acme.webhook.office.com/webhookb2/[[{uuid}@{uuid}/IncomingWebhook/{hex:32}/{uuid}]]"], ["https://acme.webhook.office.com/webhookb2/"]),
    "twilio_api_key": (["TWILIO_API_KEY=[[SK{hex:32}]]"], ["SK{hex:16}"]),
    "sendgrid_api_key": (["SENDGRID_API_KEY=[[SG.{b64url:22}.{b64url:43}]]"], ["SG.{b64url:8}.{b64url:8}"]),
    "mailgun_api_key": (["api:[[key-{hex:32}]]"], ["key-{hex:10}"]),
    "mailchimp_api_key": (["[[{hex:32}-us14]]"], ["{hex:32}-eu1"]),
    "brevo_api_key": (["[[xkeysib-{hex:64}-{alnum:16}]]"], ["xkeysib-{hex:20}"]),
    "stripe_secret_key": (["STRIPE_SECRET_KEY=[[sk_live_{alnum:99}]]", "[[sk_test_{alnum:24}]]"], ["sk_live_{alnum:8}"]),
    "stripe_restricted_key": (["[[rk_live_{alnum:99}]]"], ["rk_live_{alnum:8}"]),
    "stripe_publishable_key": (["[[pk_live_{alnum:99}]]"], ["pk_live_ keys are safe in the browser"]),
    "stripe_webhook_secret": (["STRIPE_WEBHOOK_SECRET=[[whsec_{alnum:32}]]"], ["whsec_{alnum:10}"]),
    "square_access_token": (["[[sq0atp-{b64url:22}]]", "[[EAAA{b64url:60}]]"], ["sq0atp-{b64url:10}"]),
    "square_oauth_secret": (["[[sq0csp-{b64url:43}]]"], ["sq0csp-{b64url:10}"]),
    "braintree_access_token": (["[[access_token$production${lower:16}${hex:32}]]"], ["access_token$production$<merchant>$<token>"]),
    "shopify_access_token": (["X-Shopify-Access-Token: [[shpat_{hex:32}]]"], ["shpat_{hex:16}"]),
    "shopify_custom_app_token": (["[[shpca_{hex:32}]]"], ["shpca_{hex:16}"]),
    "shopify_private_app_token": (["[[shppa_{hex:32}]]"], ["shppa_{hex:16}"]),
    "shopify_shared_secret": (["[[shpss_{hex:32}]]"], ["shpss_{hex:16}"]),
    "flutterwave_secret_key": (["[[FLWSECK_TEST-{hex:32}-X]]", "[[FLWSECK-{hex:32}-X]]"], ["FLWPUBK-{hex:32}-X"]),
    "plaid_access_token": (["[[access-sandbox-{uuid}]]"], ["access-sandbox- tokens are for testing"]),
    "shippo_api_token": (["[[shippo_live_{hex:40}]]"], ["shippo_live_{hex:20}"]),
    "easypost_api_key": (["[[EZAK{alnum:54}]]"], ["EZAK{alnum:20}"]),
    "duffel_api_token": (["[[duffel_test_{b64url:43}]]"], ["duffel_test_{alnum:10}"]),
    "anthropic_api_key": (["ANTHROPIC_API_KEY=[[sk-ant-api03-{b64url:95}AA]]"], ["sk-ant-api03-{alnum:8}"]),
    "anthropic_admin_key": (["[[sk-ant-admin01-{b64url:95}AA]]"], ["sk-ant-admin01-{alnum:8}"]),
    "openai_project_key": (["OPENAI_API_KEY=[[sk-proj-{b64url:156}]]"], ["sk-proj-{alnum:8}"]),
    "openai_service_account_key": (["[[sk-svcacct-{b64url:156}]]"], ["sk-svcacct-{alnum:8}"]),
    "openai_admin_key": (["[[sk-admin-{b64url:156}]]"], ["sk-admin-{alnum:8}"]),
    "openai_legacy_key": (["[[sk-{alnum:20}T3BlbkFJ{alnum:20}]]"], ["sk-{alnum:10}T3BlbkFJ"]),
    "openai_compatible_key": (["DEEPSEEK_API_KEY=[[sk-{hex:32}]]"], ["sk-{hex:16}"]),
    "huggingface_token": (["HF_TOKEN=[[hf_{alnum:34}]]"], ["hf_{alnum:12}"]),
    "huggingface_org_token": (["[[api_org_{alnum:34}]]"], ["api_org_{alnum:12}"]),
    "groq_api_key": (["GROQ_API_KEY=[[gsk_{alnum:52}]]"], ["gsk_{alnum:20}"]),
    "replicate_api_token": (["REPLICATE_API_TOKEN=[[r8_{alnum:37}]]"], ["r8_{alnum:10}"]),
    "perplexity_api_key": (["[[pplx-{alnum:48}]]"], ["pplx-{alnum:20}"]),
    "xai_api_key": (["XAI_API_KEY=[[xai-{alnum:80}]]"], ["xai-{alnum:20}"]),
    "langsmith_api_key": (["LANGSMITH_API_KEY=[[lsv2_pt_{hex:32}_{hex:10}]]"], ["lsv2_pt_{hex:32}"]),
    "wandb_api_key": (["WANDB_API_KEY=[[{hex:40}]]"], ["WANDB_API_KEY=$WANDB_KEY"]),
    "bcrypt_hash": (["admin:[[$2y$10${crypt:53}]]"], ["bcrypt hashes start with $2b$ and a cost"]),
    "sha512_crypt_hash": (["root:[[$6${crypt:16}${crypt:86}]]:19000:0:99999:7:::"], ["root:*:19000:0:99999:7:::"]),
    "jwt": (["id_token [[eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ{b64url:40}.{b64url:43}]]"], ["JWTs have three parts: header.payload.signature"]),
    "url_password": (["DATABASE_URL=postgres://app:[[{alnum:16}]]@db.internal:5432/app", "mongodb+srv://svc:[[{alnum:20}]]@cluster0.example.net/db"], ["https://example.com/login?next=/home", "git clone git@github.com:acme/app.git"]),
    "authorization_header": (["curl -H 'Authorization: Basic [[{b64:24}]]' https://api.example.com", "Authorization: token [[{alnum:40}]]"], ["Authorization: required for all endpoints", "the authorization: step comes after authentication"]),
    "bearer_token": (["use bearer [[{b64url:30}7]] for staging"], ["bearer bonds were popular in the 1920s", "the bearer certificates"]),
    "api_key_header": (["X-API-Key: [[{alnum:32}]]"], ["send the X-API-Key: header on every call"]),
    "netrc_password": (["machine api.example.com login alice password [[{alnum:20}]]"], ["machine learning login page password reset"]),
    "mysql_cli_password": (["mysql -u root -p[[{alnum:12}]] -h db app"], ["mysql -u root -p -h db app"]),
    "sshpass_password": (["sshpass -p '[[{alnum:14}]]' ssh deploy@host"], ["sshpass -f ~/.pw ssh deploy@host"]),
    "curl_user_password": (["curl -u admin:[[{alnum:14}]] https://ci.example.com/api"], ["curl -u admin https://ci.example.com/api"]),
    "redis_requirepass": (["requirepass [[{alnum:24}]]"], ["requirepass must be set in production"]),
    "env_assignment": (["export DB_PASSWORD=\"[[{alnum:12} {alnum:4}]]\"", "STRIPE_SECRET_KEY='[[{alnum:20}]]'", "db_password: [[{alnum:14}]]"], ["TOKEN_TTL_SECONDS=3600", "MAX_TOKENS=4096", "DB_PASSWORD=${DB_PASSWORD}"]),
    "password_assignment": (["password=[[{alnum:12}]]", '"passwd": "[[{alnum:10}]]"'], ["password: true", "password=<set-me>"]),
    "password_phrase": (["my password is [[Tr0ub4dor&3]]"], ["the password is expired", "my password is long"]),
    "secret_assignment": (["api_key: [[{hex:16}]]", "secret = [[{alnum:24}]]"], ["api key: see the vault", "secret: none"]),
}

# The catalog's own ids, read from the Rust table, so a rule without examples fails here.
here = os.path.dirname(os.path.abspath(__file__))
catalog = open(os.path.join(here, "../../../src/domain/memory/secrets.rs")).read()
ids = re.findall(r'^\s*rule\("([a-z0-9_]+)"', catalog, flags=re.M)
missing = [i for i in ids if i not in CASES]
extra = [i for i in CASES if i not in ids]
assert not missing and not extra, f"missing examples: {missing}; unknown rules: {extra}"

with open(os.path.join(here, "positive.jsonl"), "w") as pos, open(os.path.join(here, "negative.jsonl"), "w") as neg:
    for rule_id in ids:
        positives, negatives = CASES[rule_id]
        for t in positives:
            text, secrets = fill(t)
            assert secrets, f"{rule_id}: no [[secret]] in {t!r}"
            pos.write(json.dumps({"rule": rule_id, "text": text, "secrets": secrets}) + "\n")
        for t in negatives:
            text, _ = fill(t)
            neg.write(json.dumps({"rule": rule_id, "text": text}) + "\n")
print(f"{len(ids)} rules")
