"""Build the evalkit resume-generation benchmark (data/resume_gen_benchmark.jsonl) and its
conversation set (data/resume_gen_conversations.jsonl: cases with follow-up turns).

The original rsher60/resume-gen-benchmark lives on the Hugging Face hub, which this project cannot
reach, so this script rebuilds a benchmark on the same axes: two tasks, recipient personas,
synthetic candidate profiles, complexity short/medium/long by context size and an integer
formality level 1-5.  It uses no randomness: the same script always writes the same bytes.

    python data/build_dataset.py            # rewrite the committed file
    python data/build_dataset.py --check    # exit 1 if the committed file is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).with_name("resume_gen_benchmark.jsonl")
CONVERSATIONS = Path(__file__).with_name("resume_gen_conversations.jsonl")

# Follow-ups a user of the platform sends after a first draft, with the formality each asks for
# (None: the case's own level) and a think time; each conversation takes two of them.
FOLLOW_UPS = [
    ("Make it more formal: this is going to a hiring committee.", 5, 2.0),
    ("Shorter, please: it is for a recruiter who skims. Keep the company and the role.", None, 1.0),
    ("Make it warmer and more casual; we have met at a meetup before.", 2, 1.5),
    ("Add one sentence on the most relevant skill and keep everything else.", None, 1.0),
    ("Rewrite it for a founder: direct, concrete, no fluff.", 3, 2.0),
    ("Now make it very formal and respectful; the reader is a senior executive.", 5, 1.0),
    ("Tone it down to a relaxed, friendly note between peers.", 1, 1.5),
    ("Keep the content but make it one short paragraph.", None, 0.5),
]

TASKS = ["cold_outreach", "profile_rewrite"]
SCHEMA_FOR_TASK = {"cold_outreach": "outreach_email", "profile_rewrite": "profile_rewrite"}
COMPLEXITIES = ["short", "medium", "long"]

FORMALITY = {
    1: "very casual: contractions, relaxed friendly tone, like a note to a friend; no formal sign-off",
    2: "casual: friendly and direct, contractions are fine, light greeting",
    3: "neutral professional: clear and polite, a plain greeting and sign-off",
    4: "formal: no contractions or slang, courteous greeting and sign-off",
    5: "highly formal: no contractions, full formal salutation and closing, reserved and precise wording",
}

PERSONAS = [
    {
        "id": "eng_manager_fintech",
        "title": "Engineering manager at a fintech startup",
        "recipient": "Priya Nair",
        "description": "An engineering manager at a 60-person fintech startup who hires for ownership, "
        "shipping speed and reliability of payment systems; reads email on a phone between meetings.",
        "company": "Ledgerly",
        "role": "Senior Backend Engineer, Payments Platform",
        "about": "Ledgerly builds real-time invoicing and payment reconciliation software for small "
        "businesses in Europe and North America. The company raised a Series A in 2024 and processes "
        "several million transactions each month across card, bank transfer and open-banking rails.",
        "skills": ["Python", "Go", "PostgreSQL", "Kafka", "distributed systems", "API design"],
    },
    {
        "id": "technical_recruiter",
        "title": "Technical recruiter at a large cloud company",
        "recipient": "Marcus Lee",
        "description": "A technical recruiter screening hundreds of candidates a week for a large cloud "
        "provider; wants a quick match between the candidate's skills and the requisition.",
        "company": "Nimbus Cloud",
        "role": "Software Engineer, Storage Infrastructure",
        "about": "Nimbus Cloud is a public cloud provider with data centres on four continents. The "
        "storage infrastructure group runs the object store and block storage services used by more "
        "than a hundred thousand customers.",
        "skills": ["Go", "Kubernetes", "Linux", "distributed systems", "Python", "observability"],
    },
    {
        "id": "founder_cto",
        "title": "Founder and CTO of a seed-stage climate-tech startup",
        "recipient": "Elena Petrova",
        "description": "The technical co-founder of a twelve-person climate-tech startup; values "
        "generalists who can build end to end and care about the mission.",
        "company": "Gridwise",
        "role": "Founding Software Engineer",
        "about": "Gridwise forecasts electricity demand for community energy cooperatives and helps "
        "them shift flexible loads such as heat pumps and EV chargers to hours with cleaner power.",
        "skills": ["Python", "time-series forecasting", "PostgreSQL", "AWS", "React", "data pipelines"],
    },
    {
        "id": "vp_engineering",
        "title": "VP of Engineering at a mid-size healthtech company",
        "recipient": "Dr. Hannah Brooks",
        "description": "A VP of Engineering responsible for 120 engineers at a regulated healthtech "
        "company; cares about leadership, compliance awareness and measurable impact.",
        "company": "Carepath Health",
        "role": "Staff Engineer, Data Platform",
        "about": "Carepath Health provides care-coordination software to hospital networks. Its data "
        "platform ingests clinical and operational data under HIPAA and GDPR obligations.",
        "skills": ["Spark", "Airflow", "SQL", "Python", "data governance", "technical leadership"],
    },
    {
        "id": "research_pi",
        "title": "Principal investigator of an academic NLP lab",
        "recipient": "Prof. Tomás Herrera",
        "description": "A professor leading a university NLP lab who needs a research software engineer "
        "to keep experiments reproducible; values rigour, publications and open-source work.",
        "company": "Halden University NLP Lab",
        "role": "Research Software Engineer",
        "about": "The Halden University NLP Lab studies multilingual language models and evaluation "
        "methodology, with twelve PhD students and a shared GPU cluster.",
        "skills": ["PyTorch", "Python", "experiment tracking", "Hugging Face", "C++", "reproducibility"],
    },
    {
        "id": "hiring_committee",
        "title": "Formal hiring committee of a public-sector agency",
        "recipient": "Members of the Hiring Committee",
        "description": "A formal selection panel at a national public-sector agency that scores written "
        "applications against published criteria; expects a formal application letter.",
        "company": "National Statistics Office",
        "role": "Senior Data Engineer",
        "about": "The National Statistics Office produces official statistics on the economy, "
        "population and society, and is modernising its data collection pipelines.",
        "skills": ["SQL", "Python", "data pipelines", "data governance", "Spark", "documentation"],
    },
    {
        "id": "hr_generalist",
        "title": "HR generalist at a logistics company",
        "recipient": "Jordan Smith",
        "description": "An HR generalist at a logistics company who is not a software specialist; needs "
        "plain language about experience, reliability and teamwork.",
        "company": "Freightline Logistics",
        "role": "Software Engineer II",
        "about": "Freightline Logistics moves freight for retailers across 40 warehouses and is "
        "building its own routing and warehouse-management software.",
        "skills": ["Python", "SQL", "REST APIs", "teamwork", "AWS", "testing"],
    },
    {
        "id": "peer_staff_engineer",
        "title": "Peer staff engineer at a developer-tools company",
        "recipient": "Sam Okoye",
        "description": "A staff engineer at a developer-tools company who will be a peer, not a manager; "
        "responds to concrete technical detail and dislikes buzzwords.",
        "company": "Forgeworks",
        "role": "Staff Software Engineer, Build Systems",
        "about": "Forgeworks makes a remote build cache and CI acceleration service used by large "
        "monorepos; its engineers work on caching, scheduling and hermetic builds.",
        "skills": ["Go", "Bazel", "C++", "Kubernetes", "distributed systems", "performance profiling",
                   "testing"],
    },
]

CANDIDATES = [
    {
        "id": "maya_chen",
        "name": "Maya Chen",
        "headline": "Backend engineer, 7 years in payments and distributed systems",
        "skills": ["Python", "Go", "PostgreSQL", "Kafka", "Kubernetes", "distributed systems",
                   "API design", "SQL", "AWS", "observability", "testing", "teamwork"],
        "summary": "Backend engineer with seven years of experience building payment and ledger "
        "services. Led the migration of a card-settlement system to an event-driven design and "
        "mentors junior engineers.",
        "roles": [
            {"employer": "Brightwave Payments", "title": "Senior Backend Engineer", "years": "2019-2024",
             "bullets": [
                 "Designed the event-driven settlement pipeline on Kafka that processes 4 million card "
                 "transactions a day, replacing a nightly batch job.",
                 "Cut p99 latency of the payments API from 850 ms to 210 ms by reworking PostgreSQL "
                 "indexes and adding a read-through cache.",
                 "Led a team of four engineers through a PCI-DSS audit with no major findings.",
                 "Introduced contract tests between twelve services, which halved integration incidents.",
                 "Mentored three junior engineers, two of whom were promoted within eighteen months.",
             ]},
            {"employer": "Orbit Analytics", "title": "Software Engineer", "years": "2016-2019",
             "bullets": [
                 "Built REST APIs in Python and Go for a product analytics dashboard used by 300 customers.",
                 "Moved the deployment of 20 services from virtual machines to Kubernetes.",
                 "Wrote the on-call runbooks and dashboards that reduced mean time to recovery by 40 percent.",
                 "Maintained the SQL reporting layer and its test suite.",
                 "Ran quarterly load tests and capacity planning for the ingestion service.",
             ]},
        ],
        "education": "BSc Computer Science, University of Waterloo (2016)",
        "projects": [
            "Maintainer of an open-source PostgreSQL migration linter with 1,200 GitHub stars.",
            "Speaker at a regional Go conference on idempotent payment APIs.",
        ],
        "certifications": ["AWS Certified Solutions Architect - Associate"],
        "working_style": "Prefers small, reversible changes behind feature flags; writes a one-page "
        "design note before large work; keeps a public changelog for every service she owns; "
        "believes that on-call load is a product problem and tracks pages per engineer each month.",
        "references": [
            "Former manager at Brightwave Payments: 'Maya made our settlement system boring, which is "
            "the highest praise for a payments system.'",
            "Former teammate at Orbit Analytics: 'Her runbooks were the first thing new hires read.'",
        ],
    },
    {
        "id": "daniel_okafor",
        "name": "Daniel Okafor",
        "headline": "Data engineer, 5 years building governed data platforms",
        "skills": ["Python", "SQL", "Spark", "Airflow", "dbt", "AWS", "data pipelines",
                   "data governance", "documentation", "technical leadership", "teamwork", "testing"],
        "summary": "Data engineer with five years of experience building batch and streaming "
        "pipelines in regulated settings. Known for clear documentation and data-quality tooling.",
        "roles": [
            {"employer": "Meridian Health Data", "title": "Senior Data Engineer", "years": "2020-present",
             "bullets": [
                 "Built Spark and Airflow pipelines that load 2 TB of claims data a day into the warehouse.",
                 "Designed column-level lineage and access controls that passed two HIPAA audits.",
                 "Led four engineers in replacing hand-written SQL jobs with tested dbt models.",
                 "Cut warehouse costs by 35 percent by partitioning and compacting the largest tables.",
                 "Wrote the team's data-contract guidelines, adopted by six product teams.",
             ]},
            {"employer": "Copperline Retail", "title": "Data Engineer", "years": "2018-2020",
             "bullets": [
                 "Built the first event pipeline on AWS for clickstream data from the web shop.",
                 "Automated daily sales reports in Python and SQL, saving analysts ten hours a week.",
                 "Introduced data-quality checks that caught pricing errors before publication.",
                 "Documented the warehouse schema for 40 analysts.",
                 "Migrated cron jobs to Airflow with alerting and retries.",
             ]},
        ],
        "education": "MSc Data Science, University of Edinburgh (2018)",
        "projects": [
            "Contributor to an open-source data-quality library for Airflow.",
            "Volunteer teacher of SQL workshops for a non-profit coding school.",
        ],
        "certifications": ["Databricks Certified Data Engineer Associate"],
        "working_style": "Starts every pipeline with a data contract and a test; documents schemas "
        "where analysts already look; prefers boring, well-understood tools; runs a fortnightly "
        "office hour for analysts and product managers who have questions about the data.",
        "references": [
            "Director of Data at Meridian Health Data: 'Daniel turned our audits from a scramble into "
            "a checklist.'",
            "Analyst at Copperline Retail: 'His reports were right, on time, and explained.'",
        ],
    },
    {
        "id": "sofia_ramirez",
        "name": "Sofia Ramirez",
        "headline": "ML engineer, 4 years in research tooling and model serving",
        "skills": ["Python", "PyTorch", "C++", "Hugging Face", "experiment tracking", "reproducibility",
                   "Kubernetes", "Linux", "performance profiling", "React", "time-series forecasting",
                   "Go"],
        "summary": "Machine-learning engineer with four years of experience turning research code "
        "into reliable tools: training pipelines, evaluation harnesses and model-serving services.",
        "roles": [
            {"employer": "Lumen Robotics", "title": "Machine Learning Engineer", "years": "2021-present",
             "bullets": [
                 "Built the PyTorch training pipeline for perception models on a 64-GPU cluster.",
                 "Wrote a C++ inference service that serves 3,000 requests a second on the robots' "
                 "edge hardware.",
                 "Introduced experiment tracking and seeded evaluation so results reproduce across runs.",
                 "Profiled data loading and cut epoch time from 50 to 31 minutes.",
                 "Set up Kubernetes jobs for nightly regression evaluation.",
             ]},
            {"employer": "Instituto Tecnologico de Monterrey", "title": "Research Assistant",
             "years": "2019-2021",
             "bullets": [
                 "Implemented time-series forecasting baselines for an energy-demand study.",
                 "Co-authored two workshop papers on model evaluation.",
                 "Maintained the lab's Linux GPU servers and shared Python environments.",
                 "Built a small React dashboard to browse experiment results.",
                 "Packaged the lab's Hugging Face dataset loaders for reuse.",
             ]},
        ],
        "education": "MSc Computer Engineering, Instituto Tecnologico de Monterrey (2021)",
        "projects": [
            "Author of an open-source Go tool for comparing benchmark runs.",
            "Reviewer for a machine-learning reproducibility workshop.",
        ],
        "certifications": [],
        "working_style": "Treats every experiment as something another person must be able to rerun; "
        "pins environments and seeds; profiles before optimising; writes short notebooks that explain "
        "results to non-specialists; enjoys pairing with researchers on turning prototypes into tools.",
        "references": [
            "Team lead at Lumen Robotics: 'Sofia's evaluation harness is why we trust our numbers.'",
            "Supervisor at Instituto Tecnologico de Monterrey: 'Rigorous, curious and generous with "
            "her time.'",
        ],
    },
]

# Job-description paragraphs shared by all personas; the persona's own facts are substituted in.
RESPONSIBILITIES = [
    "Design, build and operate services that are central to {company}'s product.",
    "Own features end to end, from the design document through rollout, monitoring and iteration.",
    "Work with product managers and designers to turn customer problems into technical plans.",
    "Raise the quality bar through code review, testing strategy and clear documentation.",
    "Improve reliability and performance by measuring first and changing what the data shows.",
    "Take part in a fair on-call rotation and lead blameless incident reviews.",
    "Mentor other engineers and contribute to hiring for the team.",
    "Help shape the technical roadmap of the team for the next two years.",
]
REQUIREMENTS = [
    "Several years of professional software engineering experience.",
    "Strong skills in {skill_list}.",
    "Experience running production systems with real users and real incidents.",
    "Clear written communication, including design documents and postmortems.",
    "A habit of measuring before optimising and of testing what you build.",
    "Comfort working with ambiguity and making pragmatic trade-offs.",
    "Experience collaborating across teams and time zones.",
    "Care for colleagues, users and the long-term health of the codebase.",
]
NICE_TO_HAVE = [
    "Open-source contributions or public talks.",
    "Experience in a regulated or high-availability environment.",
    "Experience mentoring or leading a small team.",
    "Familiarity with cost management in the cloud.",
]
FIRST_SIX_MONTHS = [
    "In the first month you set up your environment, ship a small change to production and meet "
    "the people you will work with most.",
    "By the end of the second month you own one service or pipeline and join the on-call rotation "
    "with a buddy.",
    "By the third month you write a design document for an improvement the team has wanted for a "
    "while, and review it with senior engineers.",
    "By the sixth month you have delivered that improvement, measured its effect, and shared what "
    "you learned in a short internal talk.",
]
HOW_WE_WORK = (
    "Teams at {company} are small and cross-functional: usually four to seven engineers, a product "
    "manager and a designer. Work is planned in six-week cycles with a cool-down week between them "
    "for maintenance and experiments. Decisions that are hard to reverse get a short written design "
    "document; everything else is decided by the people doing the work. Code is reviewed by at least "
    "one other engineer, deployments are automated and happen many times a day, and every service "
    "has an owner, a dashboard and an alerting policy. The team values written communication, so "
    "that colleagues in other time zones can follow decisions without meetings."
)
TEAM_AND_STACK = (
    "You would join a team of engineers who between them maintain the core services, the data "
    "stores behind them and the tooling around them. The stack uses {skill_list}, with managed "
    "cloud services where they save effort and self-hosted components where cost or control "
    "matters. Quality is tracked with service-level objectives agreed with product owners; error "
    "budgets decide when reliability work takes priority over features. The team keeps a public "
    "roadmap, a decision log and a list of known technical debt, and it reviews all three every "
    "quarter with the wider engineering group and with the people who use its systems."
)
BENEFITS = (
    "{company} offers a competitive salary, a learning budget, flexible working hours, hybrid work "
    "from the main office, parental leave above the legal minimum, and a clear progression framework "
    "with published expectations for each level. The interview process has four steps: a short call, "
    "a technical conversation about past work, a practical exercise done in working hours, and a "
    "meeting with the team."
)

SYSTEM_PROMPT = (
    "You are a careful writing assistant on a resume platform. Use only facts given in the "
    "candidate profile and the job information: never invent employers, dates, numbers or degrees. "
    "Follow the requested formality level exactly. Reply with one JSON object and nothing else."
)

TASK_INSTRUCTION = {
    "cold_outreach": (
        "Write a short cold outreach email from {name} to {recipient} ({persona_title}) about the "
        "{role} role at {company}. Mention {company}, the role, and the candidate's skills that match "
        "it. End with one clear call to action.\n"
        'JSON fields: "subject" (under 80 characters), "body" (under 600 characters), '
        '"sign_off" (under 40 characters).'
    ),
    "profile_rewrite": (
        "Rewrite {name}'s profile headline and summary for the {role} role at {company}, so that it "
        "speaks to {recipient} ({persona_title}). Mention {company}, the role, and the candidate's "
        "skills that match it.\n"
        'JSON fields: "headline" (under 100 characters), "summary" (under 600 characters), '
        '"skills" (a list of at most 6 skills from the profile).'
    ),
}


def matching_skills(persona: dict, candidate: dict) -> list[str]:
    return [s for s in persona["skills"] if s in candidate["skills"]]


def render_profile(c: dict, complexity: str) -> str:
    if complexity == "short":
        return f"Candidate: {c['name']}, {c['headline']}. Top skills: {', '.join(c['skills'][:4])}."
    lines = [f"Candidate: {c['name']}", f"Headline: {c['headline']}", f"Summary: {c['summary']}",
             f"Skills: {', '.join(c['skills'])}"]
    n_bullets = 2 if complexity == "medium" else 5
    for r in c["roles"]:
        lines.append(f"- {r['title']}, {r['employer']} ({r['years']})")
        lines += [f"  * {b}" for b in r["bullets"][:n_bullets]]
    lines.append(f"Education: {c['education']}")
    if complexity == "long":
        lines += [f"Project: {p}" for p in c["projects"]]
        lines += [f"Certification: {x}" for x in c["certifications"]]
        lines.append(f"Working style: {c['working_style']}")
        lines += [f"Reference note: {x}" for x in c["references"]]
    return "\n".join(lines)


def render_job(p: dict, complexity: str) -> str:
    if complexity == "short":
        return f"Job: {p['role']} at {p['company']}."
    skill_list = ", ".join(p["skills"])
    fill = {"company": p["company"], "skill_list": skill_list}
    lines = [f"Job: {p['role']} at {p['company']}", f"About {p['company']}: {p['about']}"]
    n = 4 if complexity == "medium" else len(RESPONSIBILITIES)
    lines.append("Responsibilities:")
    lines += [f"- {x.format(**fill)}" for x in RESPONSIBILITIES[:n]]
    lines.append("Requirements:")
    lines += [f"- {x.format(**fill)}" for x in REQUIREMENTS[: (3 if complexity == "medium" else None)]]
    if complexity == "long":
        lines.append("Nice to have:")
        lines += [f"- {x}" for x in NICE_TO_HAVE]
        lines.append("Your first six months:")
        lines += [f"- {x}" for x in FIRST_SIX_MONTHS]
        lines.append(f"How we work: {HOW_WE_WORK.format(**fill)}")
        lines.append(f"Team and stack: {TEAM_AND_STACK.format(**fill)}")
        lines.append(f"Benefits and process: {BENEFITS.format(**fill)}")
        lines.append(f"About the reader of your message: {p['description']}")
    return "\n".join(lines)


def build_case(task: str, p: dict, c: dict, complexity: str, formality: int) -> dict:
    skills = matching_skills(p, c)
    instruction = TASK_INSTRUCTION[task].format(
        name=c["name"], recipient=p["recipient"], persona_title=p["title"].lower(),
        role=p["role"], company=p["company"],
    )
    user = "\n\n".join([
        instruction,
        f"Formality level: {formality} of 5 ({FORMALITY[formality]}).",
        render_job(p, complexity),
        render_profile(c, complexity),
    ])
    return {
        "id": f"{task}-{p['id']}-{c['id']}-{complexity}",
        "task": task,
        "persona": p["id"],
        "persona_title": p["title"],
        "persona_description": p["description"],
        "candidate": c["id"],
        "complexity": complexity,
        "formality": formality,
        "schema": SCHEMA_FOR_TASK[task],
        "context_keys": {"company": p["company"], "role": p["role"], "skills": skills},
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user},
        ],
    }


def build() -> list[dict]:
    cases = []
    for ti, task in enumerate(TASKS):
        for pi, p in enumerate(PERSONAS):
            for ci, c in enumerate(CANDIDATES):
                for xi, complexity in enumerate(COMPLEXITIES):
                    # A fixed Latin-square-like walk, so every stratum sees every formality level.
                    formality = (pi + 2 * ci + 3 * xi + ti) % 5 + 1
                    cases.append(build_case(task, p, c, complexity, formality))
    return cases


def build_conversations() -> list[dict]:
    """36 conversations: a short or medium case, then two follow-ups (one row per turn)."""
    base = [c for c in build() if c["complexity"] in ("short", "medium")]
    out = []
    for i, c in enumerate([base[2 * j + j % 2] for j in range(36)]):  # short and medium, alternating
        turns = []
        for k in (i % len(FOLLOW_UPS), (i * 3 + 1) % len(FOLLOW_UPS)):
            text, formality, think = FOLLOW_UPS[k]
            turn = {"content": text, "think_time_s": think}
            if formality is not None:
                turn["formality"] = formality
            turns.append(turn)
        out.append({**c, "id": f"conv-{c['id']}", "turns": turns})
    return out


def serialise(cases: list[dict]) -> str:
    return "".join(json.dumps(c, ensure_ascii=False, sort_keys=True) + "\n" for c in cases)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed file is stale")
    args = ap.parse_args()
    files = {OUT: serialise(build()), CONVERSATIONS: serialise(build_conversations())}
    if args.check:
        stale = [p for p, text in files.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
        for p in stale:
            print(f"{p} is stale: run python {Path(__file__).name}", file=sys.stderr)
        if not stale:
            print(f"{', '.join(str(p) for p in files)}: up to date")
        return 1 if stale else 0
    for p, text in files.items():
        p.write_text(text, encoding="utf-8")
        print(f"wrote {len(text.splitlines())} cases to {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
